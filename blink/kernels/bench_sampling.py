"""GPU micro-benchmark of the sampler: median time of one captured sample() per batch size and scenario.

    python -m blink.kernels.bench_sampling [--sizes 1 8 32 128] [--old-rev 1520210 | --old-file F] [--no-check]

Each (scenario, S) is captured in a CUDA graph, as the engine runs it, and timed with
triton.testing.do_bench (median, L2 flushed before each replay). The old sort-based implementation is
loaded from git (--old-rev) when git is available, for a side-by-side column. The check column compares
the GPU result with the CPU reference (sampling_ref): tokens, thresholds and top-logprob ids that differ
(expected 0; a rare 1 would come from exp/log differing by an ulp between the GPU and the CPU).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile

import torch
import triton

from blink.engine.sampling_state import SamplingState
from blink.kernels import sampling
from blink.request import MAX_TOP_LOGPROBS, SamplingParams

VOCAB = 128256
SCENARIOS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "top_k+top_p": SamplingParams(temperature=0.8, top_k=50, top_p=0.95),
    "top_p": SamplingParams(temperature=0.8, top_p=0.9),
    "min_p": SamplingParams(temperature=0.8, min_p=0.05),
    "penalties": SamplingParams(temperature=0.8, repetition_penalty=1.1, presence_penalty=0.5,
                                frequency_penalty=0.3, logit_bias={13: 2.0, 1000: -5.0}),
    "logprobs20": SamplingParams(temperature=0.8, logprobs=20),
}


def load_old(rev: str, old_file: str | None):
    """The old sampling module (a file, or git revision `rev`), or None where neither can be read."""
    try:
        if old_file:
            with open(old_file) as f:
                source = f.read()
        else:
            source = subprocess.run(["git", "show", f"{rev}:blink/kernels/sampling.py"], check=True,
                                    capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = tempfile.NamedTemporaryFile("w", suffix="_old_sampling.py", delete=False)
    path.write(source)
    path.close()
    spec = importlib.util.spec_from_file_location("old_sampling", path.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_batch(num_rows: int, params: SamplingParams, device: str):
    gen = torch.Generator().manual_seed(num_rows)
    logits = torch.randn(num_rows, VOCAB, generator=gen) * 2.5
    peaks = torch.randint(0, VOCAB, (num_rows, 8), generator=gen)
    logits.scatter_add_(1, peaks, torch.full((num_rows, 8), 9.0))  # a few likely tokens, like a real model
    logits = logits.bfloat16().float()
    state = SamplingState(num_rows + 1, VOCAB, device)
    for slot in range(num_rows):
        history = torch.randint(0, VOCAB, (64,), generator=gen).tolist()
        state.set_slot(slot, params, seed=slot, prompt_ids=history[:48], output_ids=history[48:])
    slots = torch.arange(num_rows, dtype=torch.int32)
    positions = torch.randint(0, 4096, (num_rows,), generator=gen)
    return logits, slots, positions, state


def time_graph(fn) -> float:
    """Median microseconds of one replay of `fn` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, return_mode="median") * 1000


def check(logits, slots, positions, state, cpu_state) -> int:
    """How many tokens, thresholds and top-logprob ids differ between the GPU and the CPU reference."""
    got = sampling.sample(logits, slots, positions, state, MAX_TOP_LOGPROBS)
    cpu = [t.cpu() for t in (logits, slots, positions)]
    ref = sampling.sample_ref(*cpu, cpu_state, MAX_TOP_LOGPROBS)
    penalized = sampling.apply_penalties_ref(cpu[0], cpu[1], cpu_state)
    threshold = sampling.keep_thresholds_triton(penalized.cuda(), slots, state).cpu()
    return int((got.token_ids.cpu() != ref.token_ids).sum() + (threshold != sampling.keep_thresholds(
        penalized, cpu[1], cpu_state)).sum() + (got.top_ids.cpu() != ref.top_ids).any(dim=1).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--old-rev", default="1520210", help="git revision of the old sampler ('' to skip)")
    parser.add_argument("--old-file", help="the old sampling.py as a file (where the tree has no git)")
    parser.add_argument("--no-check", action="store_true", help="skip the CPU-reference comparison")
    args = parser.parse_args()
    old = load_old(args.old_rev, args.old_file) if args.old_rev or args.old_file else None
    print(f"V={VOCAB}, {torch.cuda.get_device_name()}, old implementation: "
          f"{(args.old_file or args.old_rev) if old else 'unavailable'}")
    print(f"{'scenario':<13}{'S':>5}{'new us':>10}{'old us':>10}{'speedup':>9}{'mismatch':>10}")
    for name, params in SCENARIOS.items():
        for num_rows in args.sizes:
            logits, slots, positions, cpu_state = make_batch(num_rows, params, "cpu")
            state = SamplingState(cpu_state.max_slots, VOCAB, "cuda")
            for field, tensor in vars(cpu_state).items():
                if isinstance(tensor, torch.Tensor):
                    getattr(state, field).copy_(tensor)
            gpu = (logits.cuda(), slots.cuda(), positions.cuda())
            new_us = time_graph(lambda: sampling.sample(*gpu, state, MAX_TOP_LOGPROBS))  # noqa: B023
            old_us = (time_graph(lambda: old.sample(*gpu, state, MAX_TOP_LOGPROBS))  # noqa: B023
                      if old else float("nan"))
            bad = "-" if args.no_check else str(check(*gpu, state, cpu_state))
            print(f"{name:<13}{num_rows:>5}{new_us:>10.1f}{old_us:>10.1f}{old_us / new_us:>9.1f}{bad:>10}",
                  flush=True)


if __name__ == "__main__":
    main()
