"""`blink bench offline`: output tok/s on a fixed synthetic workload (default 64 requests, 256 prompt /
128 output tokens, ignore EOS, greedy) for blink's engines and HF transformers continuous batching
(`generate_batch`) on the same random weights, against the workload's roofline bound."""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import time
from dataclasses import asdict

import numpy as np
import torch

from blink.bench.drive import run_greedy
from blink.bench.roofline import ModelShape
from blink.bench.step_split import format_split, last_run_steps, split_steps
from blink.config import EngineArgs


def add_parser(sub) -> None:
    p = sub.add_parser("offline", help="offline throughput: blink engines vs HF transformers (GPU)")
    p.add_argument("--model", default="llama3-8b", help="a preset")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--engines", default="device,host,hf")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--result-json", default=None)
    p.set_defaults(handler=run)


def workload_floor_s(shape: ModelShape, n: int, plen: int, olen: int, budget: int) -> float:
    """Sum of per-step floors: prefill in budget-sized chunks, then olen-1 decode steps at batch n."""
    total, done = 0.0, 0
    while done < n * plen:
        t = min(budget, n * plen - done)
        # Chunks cover whole prompts in order; attention pairs of a full prompt are plen*(plen+1)/2.
        total += shape.step_floor_s(t, t // 2, t * (plen + 1) // 2)
        done += t
    for i in range(olen - 1):
        total += shape.decode_floor_s(n, plen + i + 1)
    return total


_request_ids = itertools.count(1)  # ids stay unique across runs on one engine


def run_engine(engine, prompts, olen, timeout_s: float = 120.0) -> tuple[float, int]:
    # Not torch.cuda.synchronize(): device mode's scheduler kernel stays resident (on its own non-blocking
    # stream) until shutdown, and a device-wide synchronize waits for it forever.
    torch.cuda.current_stream().synchronize()
    return run_greedy(engine, prompts, olen, _request_ids, timeout_s)


def run_hf(hf_model, prompts, olen) -> tuple[float, int, str]:
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=olen, do_sample=False, eos_token_id=-1, pad_token_id=0)
    for impl in ["paged|sdpa", "sdpa_paged", "paged_attention"]:
        try:
            hf_model.set_attn_implementation(impl)
            hf_model.generate_batch(inputs=prompts[:2], generation_config=GenerationConfig(
                max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0))
        except Exception as e:  # transformers' names for the paged backend changed across 5.x
            print(f"HF attn {impl}: {type(e).__name__}: {str(e)[:120]}")
            continue
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = hf_model.generate_batch(inputs=prompts, generation_config=gc)
        torch.cuda.synchronize()
        return time.perf_counter() - start, sum(len(v.generated_tokens) for v in out.values()), impl
    raise RuntimeError("no paged attention implementation of transformers worked")


def run(ns: argparse.Namespace) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    from blink.core.loaded_model import LoadedModel
    from blink.model.presets import PRESETS
    from blink.model.weights import load_hf_tensors

    if not torch.cuda.is_available():
        raise ValueError("bench offline needs a CUDA GPU")
    hf_dict = dict(PRESETS[ns.model])
    if ns.num_layers:
        hf_dict["num_hidden_layers"] = ns.num_layers
    hf_cfg = AutoConfig.for_model(hf_dict["architectures"][0].replace("ForCausalLM", "").lower(), **hf_dict)
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf_model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16).eval()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, hf_cfg.vocab_size - 1000, ns.input_len).tolist() for _ in range(ns.num_prompts)]
    max_len = ns.input_len + ns.output_len + 16
    args = EngineArgs(model=ns.model, dtype="bfloat16", device="cuda", max_num_seqs=max(ns.num_prompts, 1),
                      max_num_batched_tokens=ns.max_num_batched_tokens, max_model_len=max_len,
                      gpu_memory_utilization=0.6)
    loaded = LoadedModel.load(args, num_layers=ns.num_layers)
    load_hf_tensors(loaded.model, hf_model.state_dict().items())  # the same random weights as HF's
    shape = ModelShape.of(loaded.cfg)
    floor = workload_floor_s(shape, ns.num_prompts, ns.input_len, ns.output_len, loaded.limits.max_num_batched_tokens)
    bound = ns.num_prompts * ns.output_len / floor
    results = {"model": ns.model, "layers": loaded.cfg.num_hidden_layers, "workload":
               [ns.num_prompts, ns.input_len, ns.output_len], "roofline_tok_s": round(bound, 1)}
    print(f"workload {ns.num_prompts} x ({ns.input_len} in, {ns.output_len} out): roofline bound "
          f"{bound:.0f} tok/s (floor {floor * 1e3:.1f} ms)", flush=True)
    for name in ns.engines.split(","):
        if name == "hf":
            dt, n, impl = run_hf(hf_model, prompts, ns.output_len)
            label = f"hf generate_batch ({impl})"
        else:
            engine = _engine(name, args, loaded)
            run_engine(engine, prompts[:2], 4)  # warm-up
            steps_before = engine.stats().steps
            dt, n = run_engine(engine, prompts, ns.output_len)
            steps = last_run_steps(engine.step_times(), engine.stats().steps - steps_before)
            splits = split_steps(steps, shape, ns.input_len, ns.output_len)
            print(f"{name}: the run's steps by kind\n{format_split(splits, dt)}", flush=True)
            results[f"{name}_steps"] = [dict(asdict(k), ratio=round(k.ratio, 3)) for k in splits]
            b1_dt, b1_n = run_engine(engine, prompts[:1], ns.output_len)
            b1_ms = b1_dt / b1_n * 1e3
            b1_floor = shape.decode_floor_s(1, ns.input_len + ns.output_len // 2) * 1e3
            results[f"{name}_batch1_ms_per_token"] = round(b1_ms, 3)
            results[f"{name}_batch1_ratio_to_floor"] = round(b1_ms / b1_floor, 3)
            print(f"{name}: batch-1 {b1_ms:.3f} ms/token (floor {b1_floor:.3f}, ratio {b1_ms / b1_floor:.2f}; "
                  "includes prefill)")
            engine.shutdown()
            engine = None  # free its CUDA graphs now, not while the next engine's loop is resident
            gc.collect()
            label = name
        results[f"{name}_tok_s"] = round(n / dt, 1)
        print(f"{label}: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s ({n / dt / bound:.2f} of the bound)",
              flush=True)
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _engine(name: str, args: EngineArgs, loaded):
    if name == "host":
        from blink.host.engine import HostEngine

        return HostEngine(args, loaded=loaded)
    from blink.device.engine import DeviceEngine

    return DeviceEngine(args, loaded=loaded)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser()
    add_parser(_parser.add_subparsers(dest="cmd", required=True))
    _ns = _parser.parse_args()
    raise SystemExit(_ns.handler(_ns))
