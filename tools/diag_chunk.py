"""GPU diagnostics (not a test): where a server-shaped step's time goes, and the sampler's per kernel.

    python tools/diag_chunk.py chunk [sampler] [prefill]

chunk: llama3-8b with the server's buckets (max_num_seqs 64, 2,048 batched tokens): graph replay of a
100-token chunk after 2,000 cached tokens alone, with 3 decodes beside it (the cached-prefix probe's step),
and the 3 decodes alone; the same chunk in a max_num_seqs=1 runner (the step bench's prefill row); then a
kernel profile of the mixed step's graph. sampler: per-kernel time of sample() at V = 128256 for the
micro-bench's rows (bench/kernels/sampler.py; DIAG_SAMPLER_SCENARIOS, default top_p,top_k,top_p_flat,temperature;
DIAG_SAMPLER_ROWS, default 1,32). prefill: the step bench's
graph-replayed 2,048-token chunk after 30,720 cached tokens at 16- and 128-token blocks, kernel by kernel (session
33, H100: the step differed by 190 us a layer, the attention kernel alone by 52).
"""
import os
import sys

import torch

from blink.bench.step import chunks_plan, graph_replay_ms
from blink.config import EngineArgs


def _top_kernels(prof, steps, n=22):
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / steps
    for e in rows[:n]:
        print(f"  {e.device_time_total / steps:9.1f} us  x{e.count // steps:4d}  {e.key[:110]}")
    print(f"  total {total:.1f} us of kernels per step", flush=True)


def chunk(name="llama3-8b"):
    from torch.profiler import ProfilerActivity, profile

    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    decodes = [(1, 2100)] * 3
    cases = {64: {"chunk": [(100, 2000)], "chunk+3 decodes": [(100, 2000)] + decodes, "3 decodes": decodes},
             1: {"chunk": [(100, 2000)]}}
    for max_seqs, plans in cases.items():
        args = EngineArgs(model=name, dtype="bfloat16", device="cuda", max_num_seqs=max_seqs,
                          max_num_batched_tokens=2048, num_kv_blocks=600, max_model_len=4096)
        m = LoadedModel.load(args)
        runner = ModelRunner.for_model(m, use_graphs=True)
        for label, spec in plans.items():
            plan = chunks_plan(spec, 16)
            bucket = runner.bucket_for(sum(t for t, _ in spec), len(spec))
            runner.prepare(plan, runner.buffers, bucket)
            ms = graph_replay_ms(runner.graphs[bucket], 50)
            print(f"{name} max_num_seqs={max_seqs:3d} {label:16s} bucket {bucket}: {ms:.3f} ms", flush=True)
            if label == "chunk+3 decodes" or (max_seqs == 1 and label == "chunk"):
                with profile(activities=[ProfilerActivity.CUDA]) as p:
                    for _ in range(5):
                        runner.graphs[bucket].replay()
                    torch.cuda.synchronize()
                print(f"  kernels of that graph (5 replays, us per step; bucket {bucket}):")
                _top_kernels(p, 5)
        del runner, m
        torch.cuda.empty_cache()


def prefill(name="llama3-8b", tokens=2048, context=30720):
    from torch.profiler import ProfilerActivity, profile

    from blink.bench.step import prefill_runner

    for block_size in (16, 128):  # the step bench's runner for this row (graphs: the chunk follows a context)
        m, runner, _ = prefill_runner(name, [(tokens, context)], block_size=block_size)
        bucket = runner.bucket_for(tokens, 1)
        runner.prepare(chunks_plan([(tokens, context)], block_size), runner.buffers, bucket)
        ms = graph_replay_ms(runner.graphs[bucket], 20)
        print(f"{name} {tokens} tokens after {context} cached, {block_size}-token blocks, bucket {bucket}: "
              f"{ms:.3f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                runner.graphs[bucket].replay()
            torch.cuda.synchronize()
        _top_kernels(p, 3, n=16)
        del runner, m
        torch.cuda.empty_cache()


def sampler():
    from torch.profiler import ProfilerActivity, profile

    from bench.kernels.sampler import SCENARIOS, make_batch, to_cuda
    from blink.kernels import sampling
    from blink.request import MAX_TOP_LOGPROBS

    scenarios = os.environ.get("DIAG_SAMPLER_SCENARIOS", "top_p,top_k,top_p_flat,temperature").split(",")
    for scenario in scenarios:
        for rows in [int(r) for r in os.environ.get("DIAG_SAMPLER_ROWS", "1,32").split(",")]:
            logits, slots, positions, cpu_state = make_batch(rows, SCENARIOS[scenario], scenario.endswith("_flat"))
            state = to_cuda(cpu_state)
            gpu = (logits.cuda(), slots.cuda(), positions.cuda())
            for _ in range(3):
                sampling.sample(*gpu, state, MAX_TOP_LOGPROBS)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(10):
                    sampling.sample(*gpu, state, MAX_TOP_LOGPROBS)
                torch.cuda.synchronize()
            print(f"sampler {scenario} S={rows}: kernels (10 calls, us per call)")
            _top_kernels(p, 10, n=10)


if __name__ == "__main__":
    for what in sys.argv[1:]:
        {"chunk": chunk, "sampler": sampler, "prefill": prefill}[what]()
