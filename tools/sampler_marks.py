"""Which rows of the sampler micro-bench's batch (bench/kernels/sampler.py) the rejection decides within R rounds,
and which it leaves to the threshold search. Runs the penalties kernel and the rounds alone; on a CPU machine under
the interpreter (about 45 s for 32 rows at V = 128k):

    TRITON_INTERPRET=1 python tools/sampler_marks.py --rows 32 --scenario top_p --reject 1 2

The bench times a captured graph replaying the same seeds, so its rows' marks are these on every replay. A pending
row costs the whole search (its chunks keep the programs they have at full batch), which is why one round at 32 rows
was slower than none (session 35: 2 of 32 top_p rows pending after one round, none after two).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.kernels.sampler import SCENARIOS, make_batch, other_positions  # noqa: E402
from blink.kernels.sampling import penalize_and_reject  # noqa: E402
from blink.kernels.sampling_grid import RACE_CAPACITY, _Plan  # noqa: E402
from blink.kernels.sampling_plan import DECIDED, PENDING, SEARCH  # noqa: E402

MARK = {int(DECIDED.value): "D", int(PENDING.value): "P", int(SEARCH.value): "S"}


def marks(rows: int, scenario: str, setting: str, draw: int = 0) -> str:
    """One letter a row: D decided, P pending (the search runs it), S not taken (the search runs it). draw > 0: the
    bench's other position vectors (sampler.other_positions, --draws), other race noise."""
    logits, slots, positions, state = make_batch(rows, SCENARIOS[scenario], scenario.endswith("_flat"))
    if draw:
        positions = other_positions(positions, draw)[-1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        from bench.kernels.sampler import to_cuda
        logits, slots, positions, state = logits.cuda(), slots.cuda(), positions.cuda(), to_cuda(state)
    plan = _Plan(logits, race=RACE_CAPACITY, compact_once=True, reject=setting)
    penalize_and_reject(logits, slots, positions, state, plan, max_top_logprobs=0)
    return "".join(MARK[int(m)] for m in plan.reject_state[:, 0].tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32])
    parser.add_argument("--scenario", nargs="+", default=["top_p"], choices=sorted(SCENARIOS))
    parser.add_argument("--reject", nargs="+", default=["1", "2"], help="settings as BLINK_SAMPLER_REJECT's: 2, 1k")
    parser.add_argument("--draws", type=int, default=1, help="the bench's first K position vectors (--draws there)")
    args = parser.parse_args()
    for rows in args.rows:
        for scenario in args.scenario:
            for setting in args.reject:
                for draw in range(args.draws):
                    mark = marks(rows, scenario, setting, draw)
                    print(f"{scenario:<12} S={rows:<4} reject={setting:<3} draw {draw}  decided {mark.count('D'):>3}  "
                          f"pending {mark.count('P'):>3}  not taken {mark.count('S'):>3}  {mark}", flush=True)


if __name__ == "__main__":
    main()
