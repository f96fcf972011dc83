"""Each draw of the sampler micro-bench's batch on its own: its time with R rounds beside the rows one round leaves
pending (so a draw's time can be set against the later rounds it needs). On a GPU:

    python tools/sampler_draws.py --rows 32 --scenario top_p --reject 2 --draws 16
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kernels import sampler as bench  # noqa: E402
from blink.kernels import sampling  # noqa: E402
from blink.kernels.sampling_grid import RACE_CAPACITY  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--scenario", default="top_p", choices=sorted(bench.SCENARIOS))
    parser.add_argument("--reject", default="2")
    parser.add_argument("--draws", type=int, default=16)
    args = parser.parse_args()
    logits, slots, positions, cpu_state = bench.make_batch(args.rows, bench.SCENARIOS[args.scenario],
                                                           args.scenario.endswith("_flat"))
    state = bench.to_cuda(cpu_state)
    logits, slots = logits.cuda(), slots.cuda()
    draws = [positions] + bench.other_positions(positions, args.draws - 1)
    common = dict(num_buckets=128, programs=None, race=RACE_CAPACITY, once=True, floor=True)
    for k, pos in enumerate(draws):
        pos = pos.cuda()
        us = bench.time_graph(lambda pos=pos: sampling.sample_triton(
            logits, slots, pos, state, bench.MAX_TOP_LOGPROBS, 128, None, race=RACE_CAPACITY, compact_once=True,
            reject=args.reject, topk_floor=True))
        left = [bench.undecided(logits, slots, pos, state, reject=r, **common) for r in ("1", args.reject)]
        print(f"draw {k:>2}  {us:7.1f} us  pending after 1 round {left[0]:>2}, after {args.reject}: {left[1]:>2}",
              flush=True)


if __name__ == "__main__":
    main()
