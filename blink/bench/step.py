"""`blink bench step`: one decode step (forward + sampling) replayed from its CUDA graph, per preset and
batch size, with a fixed context per sequence, against the roofline floor (blink/bench/roofline.py).
For a mixture of experts (qwen3-30b-a3b) the floor reads the experts the batch is expected to touch."""
from __future__ import annotations

import argparse
import json

import torch

from blink.bench.roofline import ModelShape
from blink.config import EngineArgs


def add_parser(sub) -> None:
    p = sub.add_parser("step", help="decode step time from CUDA graphs vs the roofline floor (GPU)")
    p.add_argument("--presets", default="llama3-8b,llama3.2-1b,qwen3-8b",
                   help="comma-separated presets (also phi-4, qwen3-30b-a3b, qwen3-32b)")
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--num-layers", type=int, default=None, help="override layers (quick checks)")
    p.add_argument("--max-prompt-logprob-rows", type=int, default=EngineArgs.max_prompt_logprob_rows,
                   help="prompt-logprob rows in the graphs (0: none; compare to see their cost, default: "
                        "%(default)s as the engine)")
    p.add_argument("--result-json", default=None)
    p.set_defaults(handler=run)


def decode_plan(scheduler_cls, batches: int, context: int, block_size: int):
    """A plan of `batches` sequences that each decode one token after `context` cached tokens."""
    from blink.core.outputs import ScheduledChunk, SchedulerOutput
    from blink.core.sequence import SeqStatus, Sequence
    from blink.request import SamplingParams

    chunks, blocks_per = [], -(-(context + 1) // block_size)
    for i in range(batches):
        # A distinct last token per sequence: a mixture of experts then routes the batch to many experts
        # (identical tokens over an unwritten KV cache would all pick the same few).
        seq = Sequence(i, [1 + (i * 7 + j) % 1000 for j in range(context)], SamplingParams(temperature=0),
                       seed=i, arrival=i, output_ids=[1 + (i * 7919) % 1000], num_computed=context, slot=i,
                       status=SeqStatus.RUNNING)
        seq.block_ids = list(range(i * blocks_per, (i + 1) * blocks_per))
        chunks.append(ScheduledChunk(seq, context, 1))
    return SchedulerOutput(chunks, [])


def graph_replay_ms(graph, iters: int) -> float:
    """Median milliseconds of one replay of `graph` (CUDA events; after 3 warm-up replays)."""
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def time_step(preset: str, batches: list[int], context: int, iters: int, layers: int | None,
              prompt_rows: int = EngineArgs.max_prompt_logprob_rows) -> list[dict]:
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    max_b = max(batches)
    blocks = max_b * (-(-(context + 1) // 16))
    args = EngineArgs(model=preset, dtype="bfloat16", device="cuda", max_num_seqs=max_b,
                      max_num_batched_tokens=max_b, num_kv_blocks=blocks, max_model_len=context + 16,
                      max_prompt_logprob_rows=prompt_rows)
    m = LoadedModel.load(args, num_layers=layers)
    runner = ModelRunner.for_model(m, use_graphs=True)
    shape = ModelShape.of(m.cfg)
    rows = []
    for b in batches:
        plan = decode_plan(None, b, context, 16)
        bucket = runner.bucket_for(b, b)
        runner.prepare(plan, runner.buffers, bucket)
        ms = graph_replay_ms(runner.graphs[bucket], iters)
        floor = shape.decode_floor_s(b, context) * 1e3
        rows.append({"preset": preset, "layers": m.cfg.num_hidden_layers, "batch": b, "bucket": bucket[0],
                     "context": context, "prompt_logprob_rows": prompt_rows, "ms": round(ms, 4),
                     "floor_ms": round(floor, 4),
                     "ratio": round(ms / floor, 3), "experts_read_per_layer": round(shape.touched_experts(b), 1)})
        print(f"{preset:12s} layers={m.cfg.num_hidden_layers:3d} batch={b:4d} (bucket {bucket[0]:4d}) "
              f"ctx={context}: {ms:8.3f} ms  floor {floor:8.3f} ms  ratio {ms / floor:5.2f}", flush=True)
    del runner, m
    torch.cuda.empty_cache()
    return rows


def run(ns: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ValueError("bench step needs a CUDA GPU")
    batches = [int(b) for b in ns.batches.split(",")]
    rows = []
    for preset in ns.presets.split(","):
        rows += time_step(preset, batches, ns.context, ns.iters, ns.num_layers, ns.max_prompt_logprob_rows)
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser()
    add_parser(_parser.add_subparsers(dest="cmd", required=True))
    _ns = _parser.parse_args()
    raise SystemExit(_ns.handler(_ns))
