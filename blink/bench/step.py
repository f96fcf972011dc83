"""`blink bench step`: one decode step (forward + sampling) replayed from its CUDA graph, per preset, batch
size and sampling mode (--sampling: greedy, top_p, ...), with a fixed context per sequence, against the
roofline floor (blink/bench/roofline.py); and, with --prefill-tokens, one sequence's prefill of T tokens
(eager forward, no graph) against its compute floor (GEMM + causal attention FLOPs at the GEMM rate).
For a mixture of experts (qwen3-30b-a3b) the floor reads the experts the batch is expected to touch."""
from __future__ import annotations

import argparse
import json

import torch

from blink.bench.roofline import COPY_BW, GEMM_RATE, ModelShape
from blink.config import EngineArgs
from blink.request import SamplingParams

DEVICE = "cuda"  # the CPU dry run (tests/bench/test_step_bench.py) sets "cpu": prefill rows only, eager
SAMPLING_MODES = {  # what every slot of a decode row samples with
    "greedy": SamplingParams(temperature=0.0),
    "top_p": SamplingParams(temperature=0.7, top_p=0.9),
    "top_k": SamplingParams(temperature=0.7, top_k=50),
    "top_k+top_p": SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
}
# A mode replays the graph the engines launch for its rows (ModelRunner.run: without the sampler's search where
# they need none and BLINK_SAMPLER_SEARCHLESS is on); with this suffix, the graph with the search whatever the
# rows: greedy against greedy-search is what the search's launches cost a step.
WITH_SEARCH = "-search"


def mode_params(mode: str) -> tuple[SamplingParams, bool]:
    """The rows' parameters of a --sampling mode and whether it asks for the graph with the search; ValueError if
    unknown."""
    base = mode.removesuffix(WITH_SEARCH)
    if base not in SAMPLING_MODES:
        raise ValueError(f"--sampling: unknown mode {mode!r}; known: {list(SAMPLING_MODES)}, each optionally with "
                         f"{WITH_SEARCH!r}")
    return SAMPLING_MODES[base], base != mode


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
    p.add_argument("--sampling", default="greedy",
                   help=f"comma-separated sampling modes of the decode rows ({', '.join(SAMPLING_MODES)}; "
                        f"each as the engine runs it; greedy{WITH_SEARCH}: its graph with the sampler's search)")
    p.add_argument("--rounds", type=int, default=1,
                   help="decode rows: time every mode this many times, rotating their order each round; a row's ms "
                        "is the median over rounds (its rounds in the JSON's ms_rounds)")
    p.add_argument("--prefill-tokens", default="",
                   help="comma-separated prompt lengths T (e.g. 2048,8192,32768): a prefill row each; T@C is a "
                        "chunk of T tokens after C cached ones (a prefix-cache hit's step, e.g. 100@2000), timed "
                        "by graph replay when T fits the largest bucket")
    p.add_argument("--no-decode", action="store_true", help="only the prefill rows")
    p.add_argument("--block-size", type=int, default=EngineArgs.block_size,
                   help="tokens per KV-cache block (128: a KV tile of BLINK_PREFILL_WS's kernel; default %(default)s)")
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


def round_order(modes: list[str], round_: int) -> list[str]:
    """The modes of one --rounds round, rotated by the round's number: the first mode a run times tends to time
    slower (session 39, H100: the same graph +3 to +15 us), so no mode always goes first."""
    k = round_ % len(modes)
    return modes[k:] + modes[:k]


def spread(times: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of one row's rounds (the lower middle of an even count)."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 2], ordered[0], ordered[-1]


def time_step(preset: str, batches: list[int], context: int, iters: int, layers: int | None,
              modes: list[str], prompt_rows: int = EngineArgs.max_prompt_logprob_rows,
              block_size: int = EngineArgs.block_size, rounds: int = 1) -> list[dict]:
    """One row per (mode, batch): the median over `rounds` rounds of each replay median (round_order)."""
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    max_b = max(batches)
    blocks = max_b * (-(-(context + 1) // block_size))
    args = EngineArgs(model=preset, dtype="bfloat16", device="cuda", max_num_seqs=max_b,
                      max_num_batched_tokens=max_b, num_kv_blocks=blocks, max_model_len=context + 16,
                      max_prompt_logprob_rows=prompt_rows, block_size=block_size)
    m = LoadedModel.load(args, num_layers=layers)
    runner = ModelRunner.for_model(m, use_graphs=True)
    shape = ModelShape.of(m.cfg)
    layers_ = m.cfg.num_hidden_layers
    times: dict[tuple[str, int], list[float]] = {}
    searched = {}
    for round_ in range(rounds):
        for mode in round_order(modes, round_):
            params, forced = mode_params(mode)
            search = searched[mode] = forced or params.needs_search or not runner.searchless_graphs
            graphs = runner.graphs if search else runner.searchless_graphs
            for slot in range(max_b):  # the graphs read the sampling state by slot: no recapture
                runner.sampling_state.set_slot(slot, params, seed=slot, prompt_ids=[])
            for b in batches:
                bucket = runner.bucket_for(b, b)
                runner.prepare(decode_plan(None, b, context, block_size), runner.buffers, bucket)
                ms = graph_replay_ms(graphs[bucket], iters)
                times.setdefault((mode, b), []).append(ms)
                floor = shape.decode_floor_s(b, context) * 1e3
                print(f"{preset:12s} layers={layers_:3d} batch={b:4d} (bucket {bucket[0]:4d}) ctx={context} "
                      f"{mode:11s}: {ms:8.3f} ms  floor {floor:8.3f} ms  ratio {ms / floor:5.2f}"
                      f"{f'  (round {round_ + 1})' if rounds > 1 else ''}", flush=True)
    rows = []
    for mode in modes:
        for b in batches:
            ms, low, high = spread(times[mode, b])
            floor = shape.decode_floor_s(b, context) * 1e3
            rows.append({"preset": preset, "layers": layers_, "batch": b, "bucket": runner.bucket_for(b, b)[0],
                         "context": context, "sampling": mode, "block_size": block_size,
                         "prompt_logprob_rows": prompt_rows, "search": searched[mode], "ms": round(ms, 4),
                         "ms_rounds": [round(t, 4) for t in times[mode, b]],
                         "floor_ms": round(floor, 4), "ratio": round(ms / floor, 3),
                         "experts_read_per_layer": round(shape.touched_experts(b), 1)})
            if rounds > 1:
                print(f"{preset:12s} batch={b:4d} {mode:11s}: median {ms:8.3f} ms [{low:.3f}-{high:.3f}] over "
                      f"{rounds} rounds  ratio {ms / floor:5.3f}", flush=True)
    del runner, m
    torch.cuda.empty_cache()
    return rows


def parse_prefill(spec: str) -> list[tuple[int, int]]:
    """--prefill-tokens: "2048,100@2000" -> [(2048, 0), (100, 2000)] as (chunk tokens, cached context)."""
    out = []
    for item in filter(None, spec.split(",")):
        tokens, _, context = item.partition("@")
        out.append((int(tokens), int(context or 0)))
    if any(t < 1 or c < 0 for t, c in out):
        raise ValueError(f"--prefill-tokens: {spec!r} needs T >= 1 and C >= 0 in each T or T@C")
    return out


def chunks_plan(chunks: list[tuple[int, int]], block_size: int):
    """One sequence per (tokens, context): its `tokens` prompt tokens after `context` cached ones run in one
    step, each sequence in blocks of its own (the cached blocks hold whatever the pool holds: the timing does
    not depend on their values). A (1, C) entry is a decode-shaped row."""
    from blink.core.outputs import ScheduledChunk, SchedulerOutput
    from blink.core.sequence import SeqStatus, Sequence

    scheduled, next_block = [], 0
    for i, (tokens, context) in enumerate(chunks):
        total = context + tokens
        seq = Sequence(i, [1 + ((i + j) * 7) % 500 for j in range(total)], SamplingParams(temperature=0), seed=i,
                       arrival=i, num_computed=context, slot=i, status=SeqStatus.RUNNING)
        blocks = -(-(total + 1) // block_size)
        seq.block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        scheduled.append(ScheduledChunk(seq, context, tokens))
    return SchedulerOutput(scheduled, [])


def prefill_runner(preset: str, chunks: list[tuple[int, int]], layers: int | None = None,
                   block_size: int = EngineArgs.block_size):
    """The model and runner the prefill rows time: (LoadedModel, ModelRunner, graphs). Graphs when every chunk
    follows a cached context (a prefix hit's step, as a server runs it); eager from an empty cache otherwise."""
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    widest, longest = max(t for t, _ in chunks), max(t + c for t, c in chunks)
    graphs = DEVICE == "cuda" and all(c > 0 for _, c in chunks) and widest <= EngineArgs.max_num_batched_tokens
    # A graph-replayed chunk runs in the server's bucket: (128, 64) for a 100-token chunk, whose padding rows
    # shape the attention launch (perf.md, 2026-12-01 session 8: a (128, 1) bucket hid a 1.5x slower one).
    args = EngineArgs(model=preset, dtype="bfloat16", device=DEVICE,
                      max_num_seqs=EngineArgs.max_num_seqs if graphs else 1,
                      max_num_batched_tokens=EngineArgs.max_num_batched_tokens if graphs else widest,
                      num_kv_blocks=-(-(longest + 16) // block_size) + 1, max_model_len=longest + 16,
                      block_size=block_size)
    m = LoadedModel.load(args, num_layers=layers)
    return m, ModelRunner.for_model(m, use_graphs=graphs), graphs


def time_prefill(preset: str, chunks: list[tuple[int, int]], iters: int, layers: int | None,
                 block_size: int = EngineArgs.block_size) -> list[dict]:
    """Median ms of one forward + sampling over a prefill chunk, per (tokens, context), vs its compute floor:
    eager from an empty cache (the whole-prompt rows), by graph replay after a cached context (a prefix hit's
    step, as a server runs it)."""
    m, runner, graphs = prefill_runner(preset, chunks, layers, block_size)
    shape = ModelShape.of(m.cfg)
    print(f"prefill floors: GEMM + causal attention FLOPs at {GEMM_RATE / 1e12:.0f} TFLOP/s (dense bf16), or the "
          f"weight read at {COPY_BW / 1e12:.2f} TB/s if longer", flush=True)
    rows = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for tokens, context in chunks:
        bucket = runner.bucket_for(tokens, 1)
        runner.prepare(chunks_plan([(tokens, context)], block_size), runner.buffers, bucket)
        if graphs:
            ms = graph_replay_ms(runner.graphs[bucket], iters)
        else:
            times = []
            for i in range(max(3, min(iters, 10)) + 1):
                start.record()
                runner.forward(runner.buffers, bucket[0], bucket[1])
                end.record()
                end.synchronize()
                if i:  # the first call compiles
                    times.append(start.elapsed_time(end))
            ms = sorted(times)[len(times) // 2]
        gemm, attention = shape.prefill_flops(tokens, context)
        floor = shape.prefill_floor_s(tokens, context) * 1e3
        rows.append({"preset": preset, "layers": m.cfg.num_hidden_layers, "prefill_tokens": tokens,
                     "context": context, "graph": graphs, "block_size": block_size,
                     "bucket": bucket[0], "bucket_rows": bucket[1], "ms": round(ms, 3), "floor_ms": round(floor, 3),
                     "gemm_floor_ms": round(gemm / GEMM_RATE * 1e3, 3),
                     "attention_floor_ms": round(attention / GEMM_RATE * 1e3, 3), "ratio": round(ms / floor, 3)})
        print(f"{preset:12s} layers={m.cfg.num_hidden_layers:3d} prefill T={tokens:6d} after C={context:6d} "
              f"(bucket {bucket[0]:6d} x {bucket[1]:3d}, {'graph' if graphs else 'eager'}): "
              f"{ms:9.3f} ms  floor {floor:9.3f} ms (GEMM {gemm / GEMM_RATE * 1e3:.3f} + attention "
              f"{attention / GEMM_RATE * 1e3:.3f})  ratio {ms / floor:5.2f}", flush=True)
    del runner, m
    torch.cuda.empty_cache()
    return rows


def run(ns: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ValueError("bench step needs a CUDA GPU")
    batches = [int(b) for b in ns.batches.split(",")]
    modes = ns.sampling.split(",")
    if ns.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {ns.rounds}")
    for mode in modes:
        mode_params(mode)  # refuses an unknown mode before any model is built
    chunks = parse_prefill(ns.prefill_tokens)
    fresh, cached = [ch for ch in chunks if ch[1] == 0], [ch for ch in chunks if ch[1] > 0]
    rows = []
    for preset in ns.presets.split(","):
        if not ns.no_decode:
            rows += time_step(preset, batches, ns.context, ns.iters, ns.num_layers, modes,
                              ns.max_prompt_logprob_rows, ns.block_size, ns.rounds)
        for group in (fresh, cached):  # eager whole prompts; graph-replayed chunks after a cached context
            if group:
                rows += time_prefill(preset, group, ns.iters, ns.num_layers, ns.block_size)
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser()
    add_parser(_parser.add_subparsers(dest="cmd", required=True))
    _ns = _parser.parse_args()
    raise SystemExit(_ns.handler(_ns))
