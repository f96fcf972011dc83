"""`blink bench barrier`: the tensor-parallel barrier experiment (issue 7). Every TP step is a barrier across
the ranks, so one rank's late CPU stalls all GPUs. In-process, it builds a host- or device-mode engine (any TP size,
ranks pinned with --rank-cpus), runs one fixed decode workload (N requests, ignore EOS, greedy) per
condition: isolated, an attacker on one rank's cores only (--attack-rank), attackers on all cores; and
reports the engine's step times (p50/p99/mean of the decode steps) and output tok/s per condition, with
the ratios attacked / isolated.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time

import numpy as np

from blink.bench.attackers import KINDS, Attackers, AttackSpec
from blink.bench.drive import run_greedy
from blink.config import EngineArgs

CONDITIONS = ("isolated", "rank", "all")
ATTACK_SECONDS = 24 * 3600.0  # attackers run until the condition ends (they are stopped, not timed out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    EngineArgs.add_cli_args(p)
    p.set_defaults(engine="host", tensor_parallel_size=2)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help="comma-separated, in order: isolated (no attack), rank (--attack-rank's cores), all")
    p.add_argument("--attack-rank", type=int, default=1, help="the rank whose cores the 'rank' condition attacks")
    p.add_argument("--attack-kind", choices=KINDS, default="spin")
    p.add_argument("--attack-procs-per-cpu", type=int, default=1)
    p.add_argument("--all-cpus", default=None, help="the cores of the 'all' condition (default: every core "
                   "this process may use at start)")
    p.add_argument("--settle-s", type=float, default=0.5, help="attack this long before measuring")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per condition")
    p.add_argument("--result-json", default=None)


def percentiles_ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    a = np.asarray(seconds) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 4), "p99_ms": round(float(np.percentile(a, 99)), 4),
            "mean_ms": round(float(a.mean()), 4)}


def run_workload(engine, prompts: list[list[int]], output_len: int, ids, timeout_s: float) -> dict:
    """Run every prompt to output_len tokens; the step times of exactly the steps this run took."""
    steps_before = engine.stats().steps
    wall, tokens = run_greedy(engine, prompts, output_len, ids, timeout_s)
    steps = engine.stats().steps - steps_before
    times = engine.step_times()[-steps:] if steps else []
    decode = [t.seconds for t in times if t.num_tokens == t.num_seqs]
    return {"wall_s": round(wall, 4), "output_tokens": tokens, "output_tok_s": round(tokens / wall, 2),
            "steps": steps, "decode_steps": len(decode), "step": percentiles_ms(decode),
            "all_steps": percentiles_ms([t.seconds for t in times])}


def attack_spec(condition: str, ns, rank_cpus, all_cpus: list[int]) -> AttackSpec | None:
    if condition == "isolated":
        return None
    if condition == "rank":
        if rank_cpus is None:
            raise ValueError("the 'rank' condition needs --rank-cpus, so that the attacked rank has its own cores")
        if not 0 <= ns.attack_rank < len(rank_cpus):
            raise ValueError(f"--attack-rank {ns.attack_rank} is not a rank of {len(rank_cpus)}")
        cpus = rank_cpus[ns.attack_rank]
    elif condition == "all":
        cpus = all_cpus
    else:
        raise ValueError(f"unknown condition {condition!r}; one of {CONDITIONS}")
    return AttackSpec(kind=ns.attack_kind, procs=ns.attack_procs_per_cpu * len(cpus), duration_s=ATTACK_SECONDS,
                      cpus=tuple(cpus))


def condition_name(condition: str, ns) -> str:
    return f"rank{ns.attack_rank}" if condition == "rank" else condition


def add_ratios(results: dict) -> None:
    """attacked / isolated for the step-time percentiles and the throughput."""
    base = results.get("isolated")
    if base is None:
        return
    for name, r in results.items():
        if name == "isolated":
            continue
        ratios = {k: _ratio(r["step"][k], base["step"][k]) for k in ("p50_ms", "p99_ms", "mean_ms")}
        ratios["output_tok_s"] = _ratio(r["output_tok_s"], base["output_tok_s"])
        r["ratio_to_isolated"] = ratios


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def run(ns: argparse.Namespace) -> int:
    try:
        return _run(ns)
    except ValueError as e:
        print(f"blink bench barrier: error: {e}", file=sys.stderr)
        return 2


def _run(ns: argparse.Namespace) -> int:
    from blink.bench.attackers import optional_cpu_list
    from blink.entrypoints.engine_factory import make_engine
    from blink.parallel.pinning import parse_rank_cpus
    from blink.util.cpus import pin_process

    args = EngineArgs.from_cli(ns)
    conditions = [c.strip() for c in ns.conditions.split(",") if c.strip()]
    all_cpus = optional_cpu_list(ns.all_cpus) or sorted(os.sched_getaffinity(0))  # before rank 0 pins itself
    rank_cpus = parse_rank_cpus(args.rank_cpus, args.tensor_parallel_size)
    for c in conditions:  # refuse a bad condition before loading anything
        attack_spec(c, ns, rank_cpus, all_cpus)
    if rank_cpus and args.tensor_parallel_size == 1:
        pin_process(rank_cpus[0])  # with TP the engine pins its ranks itself
    if rank_cpus and args.resolved_device == "cpu":
        import torch

        torch.set_num_threads(len(rank_cpus[0]))  # one intra-op thread per core rank 0 owns

    engine = make_engine(args)
    try:
        rng = np.random.default_rng(args.seed)
        vocab = engine.m.vocab_size
        prompts = [rng.integers(0, vocab, ns.input_len).tolist() for _ in range(ns.num_prompts)]
        ids = itertools.count(1)
        # Warm-up: the same batch shapes, so that no first-use cost (Triton, allocator) lands in a condition.
        run_workload(engine, prompts, min(4, ns.output_len), ids, ns.timeout_s)
        results: dict[str, dict] = {}
        for condition in conditions:
            spec = attack_spec(condition, ns, rank_cpus, all_cpus)
            with Attackers(spec) if spec else contextlib.nullcontext() as attackers:
                time.sleep(ns.settle_s if spec else 0)
                result = run_workload(engine, prompts, ns.output_len, ids, ns.timeout_s)
                pids = attackers.pids if spec else []
            result["attack"] = None if spec is None else {
                "kind": spec.kind, "procs": spec.procs, "cpus": list(spec.cpus), "pids": pids}
            results[condition_name(condition, ns)] = result
            _print(condition_name(condition, ns), result)
    finally:
        engine.shutdown()
    add_ratios(results)
    report = {"model": args.model, "num_layers": args.num_layers, "tensor_parallel_size": args.tensor_parallel_size,
              "engine": args.resolved_engine, "device": args.resolved_device, "rank_cpus": rank_cpus,
              "all_reduce": args.all_reduce,
              "workload": {"num_prompts": ns.num_prompts, "input_len": ns.input_len, "output_len": ns.output_len},
              "conditions": results}
    for name, r in results.items():
        if "ratio_to_isolated" in r:
            print(f"{name} / isolated: {r['ratio_to_isolated']}")
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _print(name: str, r: dict) -> None:
    s = r["step"]
    print(f"{name:>10}: decode step p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, mean {s['mean_ms']} ms "
          f"({r['decode_steps']} of {r['steps']} steps); {r['output_tok_s']} output tok/s", flush=True)
