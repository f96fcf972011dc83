"""Each draw of the sampler micro-bench's batch on its own, under each rejection setting side by side: its time
beside the rows one round and the setting's rounds leave to the search (a draw's time follows the later rounds it
needs). On a GPU:

    python tools/sampler_draws.py --rows 32 --scenario top_p --reject 3,3p,3p@1024 --draws 16

A setting "R...@N" also sets the pool rounds' unit to N tokens (sampling_grid.POOL_UNIT), "R...@N/H" also their
helpers (POOL_HELPERS).
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kernels import sampler as bench  # noqa: E402
from blink.kernels import sampling, sampling_grid  # noqa: E402
from blink.kernels.sampling_grid import RACE_CAPACITY  # noqa: E402

# the engine's column: 128 buckets, its programs, the list race, one compaction read, the lane floor
COLUMN = dict(num_buckets=128, programs=None, race=RACE_CAPACITY, once=True, floor=True)
POOL_GEOMETRY = sampling_grid.POOL_UNIT, sampling_grid.POOL_HELPERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--scenario", default="top_p", choices=sorted(bench.SCENARIOS))
    parser.add_argument("--reject", default="3", help="comma-separated BLINK_SAMPLER_REJECT settings")
    parser.add_argument("--draws", type=int, default=16)
    args = parser.parse_args()
    settings = args.reject.split(",")
    logits, slots, positions, cpu_state = bench.make_batch(args.rows, bench.SCENARIOS[args.scenario],
                                                           args.scenario.endswith("_flat"))
    state = bench.to_cuda(cpu_state)
    logits, slots = logits.cuda(), slots.cuda()
    draws = [positions] + bench.other_positions(positions, args.draws - 1)
    times = {r: [] for r in settings}
    for k, pos in enumerate(draws):
        pos = pos.cuda()
        cells = []
        for r in settings:
            reject, _, geometry = r.partition("@")
            unit, _, helpers = geometry.partition("/")
            sampling_grid.POOL_UNIT = int(unit or POOL_GEOMETRY[0])
            sampling_grid.POOL_HELPERS = int(helpers or POOL_GEOMETRY[1])
            us = bench.time_graph(lambda pos=pos, reject=reject: sampling.sample_triton(
                logits, slots, pos, state, bench.MAX_TOP_LOGPROBS, COLUMN["num_buckets"], COLUMN["programs"],
                race=COLUMN["race"], compact_once=COLUMN["once"], reject=reject, topk_floor=COLUMN["floor"]))
            times[r].append(us)
            left = bench.undecided(logits, slots, pos, state, reject=reject, **COLUMN)
            cells.append(f"{r}: {us:7.1f} us, {left:>2} left")
        one = bench.undecided(logits, slots, pos, state, reject="1", **COLUMN)
        print(f"draw {k:>2}  pending after 1 round {one:>2}  |  " + "  |  ".join(cells), flush=True)
    print("mean  " + "  |  ".join(f"{r}: {statistics.mean(t):7.1f} us" for r, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
