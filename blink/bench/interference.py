"""`blink bench interference`: request-rate sweeps per engine mode, isolated and next to CPU attackers.

For each core layout and each target (a `blink serve` engine mode started here once, or an external
server given by URL), for each attack condition and rate, one fixed-length point records the bench
metrics, the engine's host CPU seconds per 1k output tokens, GPU energy per output token and mean GPU
utilisation. Points are appended to (or replaced in) one result folder; the table and plots are
regenerated from all of them after every point, so a matrix can be filled over several calls.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import os
import shlex
import signal
import time
import traceback
from dataclasses import dataclass

import httpx
from rich.console import Console

from blink.bench.attackers import Attackers, AttackSpec, optional_cpu_list
from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.host_cpu import CpuMeter, engine_pid_from_metrics
from blink.bench.interference_report import ISOLATED, save_point, write_report
from blink.bench.runner import LoadConfig, fetch_model_name, requests_for_window, run_load
from blink.bench.serve import add_workload_arguments, build_requests, load_config, run_config
from blink.bench.server_process import BlinkServer, ServeSpec
from blink.util.cpus import format_cpu_list

LAYOUTS = ("split", "shared")


@dataclass(frozen=True)
class Target:
    """A server under test: a blink engine mode started here (`serve`), or an external `base_url`."""

    name: str
    serve: ServeSpec | None = None
    base_url: str | None = None
    engine_pid: int | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p)
    p.add_argument("--result-dir", required=True, help="points/*.json, results.md and plots go here")
    p.add_argument("--modes", default="device,host", help="blink engine modes to start, comma separated")
    p.add_argument("--extra-base-url", action="append", default=[], metavar="NAME=URL",
                   help="also measure a server already running at URL, reported as mode NAME")
    p.add_argument("--extra-engine-pid", action="append", default=[], metavar="NAME=PID",
                   help="the pid whose CPU time is charged to extra mode NAME")
    p.add_argument("--layouts", default=None,
                   help="comma separated. split: front end, engine and client on their own cores, attackers "
                        "on the engine's; shared: everything on all cores (default: split if --engine-cpus "
                        "is given, else shared)")
    p.add_argument("--request-rates", default="1,2,4,8", help="req/s, comma separated")
    p.add_argument("--attack-kinds", default="spin", help="comma separated: spin, memory, compile, tokenize")
    p.add_argument("--attack-levels", default="0,1,2",
                   help="attack processes per attacked core, comma separated; 0 = isolated")
    p.add_argument("--point-seconds", type=float, default=60.0, help="sending window of each point")
    p.add_argument("--drain-seconds", type=float, default=15.0, help="then wait this long for stragglers")
    p.add_argument("--attack-settle-seconds", type=float, default=2.0)
    p.add_argument("--warmup-requests", type=int, default=8, help="sent after each server start")
    p.add_argument("--attack-cpus", default=None,
                   help="split layout: the CPUs the attackers run on (default: --engine-cpus); e.g. one "
                        "tensor-parallel rank's core")
    p.add_argument("--client-cpus", default=None,
                   help="cores of this load generator in the split layout (default: the cores left over)")
    p.add_argument("--gpu-index", type=int, default=None, help="NVML index (default: first visible GPU)")
    serve = p.add_argument_group("blink serve")
    serve.add_argument("--dtype", default=None)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--frontend-cpus", default=None)
    serve.add_argument("--engine-cpus", default=None)
    serve.add_argument("--serve-args", default="", help="more `blink serve` flags, one shell-quoted string")
    serve.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /health")


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_named(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def targets(args: argparse.Namespace, layout: str) -> list[Target]:
    pinned_layout = layout == "split"
    found = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        spec = ServeSpec(
            engine=mode, model=args.model, tokenizer=args.tokenizer, dtype=args.dtype,
            max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=args.enforce_eager,
            host=args.host, port=args.port, frontend_cpus=args.frontend_cpus if pinned_layout else None,
            engine_cpus=args.engine_cpus if pinned_layout else None,
            extra_args=tuple(shlex.split(args.serve_args)))
        found.append(Target(name=mode, serve=spec))
    pids = parse_named(args.extra_engine_pid)
    for name, url in parse_named(args.extra_base_url).items():
        found.append(Target(name=name, base_url=url, engine_pid=int(pids[name]) if name in pids else None))
    return found


def served_model_name(base_url: str, fallback: str | None) -> str:
    """The name to put in requests: what the server lists (an external peer may serve --model under
    another name), else --model."""
    try:
        return asyncio.run(fetch_model_name(base_url))
    except (httpx.HTTPError, KeyError, IndexError):
        if fallback is None:
            raise
        return fallback


@contextlib.contextmanager
def pinned(cpus: list[int] | None):
    """Run the load generator (this thread and the threads it starts) on `cpus`, then restore."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def attack_tokenizer(args: argparse.Namespace) -> str | None:
    for path in (args.tokenizer, args.model):
        if path and os.path.isfile(os.path.join(path, "tokenizer.json")):
            return os.path.join(path, "tokenizer.json")
    return None


@dataclass
class Sweep:
    """What stays fixed while one target's points are measured."""

    args: argparse.Namespace
    layout: str
    target: str
    base_url: str
    model: str
    engine_pid: int | None
    attack_cpus: list[int]
    client_cpus: list[int] | None
    server_command: str | None
    gpu: GpuMonitor


def measure_point(sweep: Sweep, requests: list, rate: float, kind: str, level: float) -> dict:
    args = sweep.args
    procs = max(1, round(level * len(sweep.attack_cpus))) if kind != ISOLATED else 0
    attack = None
    if procs:
        attack = Attackers(AttackSpec(
            kind=kind, procs=procs, cpus=tuple(sweep.attack_cpus), tokenizer=attack_tokenizer(args),
            duration_s=args.attack_settle_seconds + args.point_seconds + args.drain_seconds + 60.0))
    config = load_config(args, sweep.base_url, sweep.model, rate, args.point_seconds, args.drain_seconds)
    cpu = CpuMeter(sweep.engine_pid)
    try:
        if attack:
            attack.start()
            time.sleep(args.attack_settle_seconds)
        cpu.start()
        sweep.gpu.start()
        with pinned(sweep.client_cpus):
            outcome = asyncio.run(run_load(config, requests[: requests_for_window(rate, args.point_seconds)]))
        gpu = sweep.gpu.stop()
        cpu_seconds = cpu.stop()
        attackers_alive = attack.running if attack else 0
    finally:
        reports = attack.stop() if attack else []
    bench = outcome.summary()
    tokens = bench["total_output_tokens"]
    per_token = lambda total, scale: total * scale / tokens if total is not None and tokens else None
    return {
        "mode": sweep.target, "layout": sweep.layout, "attack_kind": kind, "attack_level": level,
        "attack_procs": procs, "attack_cpus": format_cpu_list(sweep.attack_cpus) if procs else "",
        "attackers_alive_at_end": attackers_alive, "request_rate": rate, "point_seconds": args.point_seconds,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "base_url": sweep.base_url, "model": sweep.model, "server_command": sweep.server_command,
        "client_cpus": format_cpu_list(sweep.client_cpus), "engine_pid": sweep.engine_pid,
        "engine_cpu_seconds": cpu_seconds,
        "engine_cpu_s_per_1k_tokens": per_token(cpu_seconds, 1000),
        "gpu_energy_mj": gpu.energy_mj, "energy_per_output_token_mj": per_token(gpu.energy_mj, 1),
        "gpu_mean_utilization_pct": gpu.mean_utilization_pct,
        "attackers": [{k: r.get(k) for k in ("cpu", "iterations", "returncode")} for r in reports],
        "drain_seconds": args.drain_seconds, "attack_settle_seconds": args.attack_settle_seconds,
        "workload": run_config(args, sweep.base_url, sweep.model, rate),
        "bench": bench,
    }


def sweep_target(sweep: Sweep, requests: list, console: Console) -> int:
    """Warm up, then every (attack condition, rate) point; returns how many points failed outright."""
    args = sweep.args
    warmup = LoadConfig(base_url=sweep.base_url, model=sweep.model, ignore_eos=args.ignore_eos,
                        temperature=args.temperature, show_progress=False)
    asyncio.run(run_load(warmup, requests[: args.warmup_requests]))
    conditions = [(ISOLATED, 0.0)] if 0.0 in parse_floats(args.attack_levels) else []
    conditions += [(kind.strip(), level) for kind in args.attack_kinds.split(",") if kind.strip()
                   for level in parse_floats(args.attack_levels) if level > 0]
    failures = 0
    for kind, level in conditions:
        for rate in parse_floats(args.request_rates):
            point = measure_point(sweep, requests, rate, kind, level)
            save_point(args.result_dir, point)
            write_report(args.result_dir)
            b = point["bench"]
            console.print(f"[bold]{sweep.layout}/{sweep.target}[/bold] {kind} x{level:g} rate {rate:g}: "
                          f"{b['completed']} done, {b['failed']} failed, {b['output_throughput']:.1f} tok/s, "
                          f"P99 TTFT {b['p99_ttft_ms']:.1f} ms, P99 TPOT {b['p99_tpot_ms']:.2f} ms")
            failures += b["completed"] == 0
    return failures


def run_sweeps(args: argparse.Namespace, console: Console) -> int:
    all_cpus = sorted(os.sched_getaffinity(0))
    engine_cpus = optional_cpu_list(args.engine_cpus)
    layouts = (args.layouts or ("split" if engine_cpus else "shared")).split(",")
    if "split" in layouts and not engine_cpus:
        raise SystemExit("the split layout needs --engine-cpus")
    split_attack_cpus = optional_cpu_list(args.attack_cpus) or engine_cpus
    rates = parse_floats(args.request_rates)
    if not rates or any(math.isinf(r) or r <= 0 for r in rates):
        raise SystemExit("--request-rates must be finite and positive: each point lasts --point-seconds")
    num_requests = max(requests_for_window(max(rates), args.point_seconds), args.warmup_requests)
    requests: list = []
    gpu = GpuMonitor(args.gpu_index)
    failures = 0
    for layout in layouts:
        if layout not in LAYOUTS:
            raise SystemExit(f"unknown layout {layout!r}; one of {LAYOUTS}")
        busy = set(engine_cpus or []) | set(optional_cpu_list(args.frontend_cpus) or [])
        client = optional_cpu_list(args.client_cpus) or [c for c in all_cpus if c not in busy] or None
        for target in targets(args, layout):
            name = f"{layout}/{target.name}"
            try:
                with contextlib.ExitStack() as stack:
                    base_url, pid, command = target.base_url, target.engine_pid, None
                    if target.serve is not None:
                        log = os.path.join(args.result_dir, "logs", f"server-{layout}-{target.name}.log")
                        server = stack.enter_context(BlinkServer(target.serve, log, args.server_timeout))
                        base_url, pid = target.serve.base_url, server.engine_pid
                        command = shlex.join(target.serve.command())
                    elif pid is None:
                        with contextlib.suppress(Exception):
                            pid = engine_pid_from_metrics(base_url)
                    model = served_model_name(base_url, args.model)
                    if not requests:
                        requests = build_requests(args, base_url, model, num_requests)
                    sweep = Sweep(args=args, layout=layout, target=target.name, base_url=base_url,
                                  model=model, engine_pid=pid,
                                  attack_cpus=split_attack_cpus if layout == "split" else all_cpus,
                                  client_cpus=client if layout == "split" else None,
                                  server_command=command, gpu=gpu)
                    if pid is None:
                        console.print(f"[yellow]{name}: no engine pid, host CPU cost not measured[/yellow]")
                    failures += sweep_target(sweep, requests, console)
            except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
                console.print(f"[red]{name} failed:[/red] {exc}")
                traceback.print_exc()
                failures += 1
    gpu.close()
    return failures


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    os.makedirs(args.result_dir, exist_ok=True)
    console = Console()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # so servers and attackers are torn down
    try:
        failures = run_sweeps(args, console)
    finally:
        signal.signal(signal.SIGTERM, previous)
    console.print(f"results: {os.path.join(args.result_dir, 'results.md')}")
    return 1 if failures else 0
