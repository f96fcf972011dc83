"""GPU micro-benchmark of the sampler: one captured sample() per scenario and batch size, new vs old.

    python -m bench.kernels.sampler [--sizes 1 8 32 128] [--scenarios top_p,min_p] [--no-old] [--no-check]
                                    [--buckets 4096,512] [--programs 256,1024] [--pdl off,on,engine]
                                    [--race row,list] [--compact twice,once] [--reject 0,2] [--topk search,floor]
                                    [--search on,off] [--draws 8] [--undecided]

Each (scenario, S) runs sample() at V = 128256 captured in a CUDA graph, as the engine runs it, timed
with triton.testing.do_bench (median, L2 flushed before each replay). "old" is the sampler of git e896288
(bench/kernels/sampling_old.py: one program per row for the thresholds and the top-K logprobs), on the
same inputs. The mismatch column compares the new GPU result with the CPU reference (sampling_ref):
tokens, thresholds and rows of top-logprob ids that differ (expected 0; a rare 1 would come from exp/log
differing by an ulp between the GPU and the CPU), then after "/" the rows that took the one-program search.
max_top_logprobs is 20 in every call, as in the engine.
--buckets / --programs: one "new" column per threshold bucket count (sampling_bucket.NUM_BUCKETS is the
engine's) and programs per multi-program kernel (default: the engine's sampling_grid.programs_for(S); fewer where a
chunk would go below 2k tokens), each with its own mismatch count; the speedup is the first column's.
--pdl off,on: each column also with the sampler's seven kernels launched with programmatic dependent launch
(kernels/pdl.py; BLINK_SAMPLER_PDL in the engine), captured the same way, side by side in the same run; engine:
as the engine's default, with PDL at one row only (+pdl1).
--race row,list: each column also with the choice raced over the whole row or over the list of the tokens the
filter may keep (sampling_race; BLINK_SAMPLER_RACE in the engine, sampling_grid.RACE_CAPACITY ids a row).
--compact twice,once: each column also with the compaction reading its chunk twice or once (sampling_compact;
BLINK_SAMPLER_COMPACT in the engine).
--draws K: each cell timed over K position vectors (K graphs), the mean printed and a line of min-max under the row:
a graph replays the same draw, and the rejection's rounds leave rows pending (each costing the whole search) or not
by the draw (session 35: one round left 2 of 32 top_p rows pending on the first draw). --undecided prints, under
that, each draw's count of rows the rounds left to the search, so a slow draw can be read against its count.
--reject 0,3,3k: each column also with that many rounds of the rejection before the threshold search
(sampling_reject; k: top_k-only rows too; t: the first round only tests; s: a launch a round; BLINK_SAMPLER_REJECT
in the engine; it needs the list race: with the row race it runs none). The mismatch column's thresholds are the
search's (no rejection), its tokens the column's.
The race's noise is BLINK_SAMPLER_NOISE's (exact, fast, fast2: sampling_noise) and its uniforms BLINK_SAMPLER_HASH's
(murmur, fmix: sampling_rng), both read at import: one mode a run.
--search on,off: each column also without the search's launches (sample_triton's search=False: penalties, choice and
finish only), in the scenarios whose rows may take it (SamplingParams.needs_search; "-" in the others).
"""
from __future__ import annotations

import argparse

import torch
import triton

from bench.kernels import sampling_old
from blink.kernels import sampling, sampling_noise, sampling_rng
from blink.kernels.pdl import pdl_switched
from blink.kernels.sampling_bucket import NUM_BUCKETS
from blink.kernels.sampling_grid import RACE_CAPACITY, _Plan
from blink.kernels.sampling_plan import DECIDED
from blink.kernels.sampling_state import SamplingState
from blink.request import MAX_TOP_LOGPROBS, SamplingParams

VOCAB = 128256
SCENARIOS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "penalties": SamplingParams(temperature=0.8, repetition_penalty=1.1, presence_penalty=0.5,
                                frequency_penalty=0.3, logit_bias={13: 2.0, 1000: -5.0}),
    "min_p": SamplingParams(temperature=0.8, min_p=0.05),
    "top_k": SamplingParams(temperature=0.8, top_k=50),
    "top_p": SamplingParams(temperature=0.8, top_p=0.9),
    "top_k+top_p": SamplingParams(temperature=0.8, top_k=50, top_p=0.95),
    "logprobs20": SamplingParams(temperature=0.8, logprobs=20),
    # Flat rows, as a random-weight model's (the step bench's top_p rows): top_p keeps much of the vocabulary
    "top_p_flat": SamplingParams(temperature=0.8, top_p=0.9),
    "top_k_flat": SamplingParams(temperature=0.8, top_k=50),
}


def make_batch(num_rows: int, params: SamplingParams, flat: bool = False):
    """Random logits with a few likely tokens (like a real model's; flat: N(0, 1) and no peaks, like a
    random-weight model's), bf16-rounded; a CPU sampling state."""
    gen = torch.Generator().manual_seed(num_rows)
    logits = torch.randn(num_rows, VOCAB, generator=gen) * (1.0 if flat else 2.5)
    peaks = torch.randint(0, VOCAB, (num_rows, 8), generator=gen)
    if not flat:
        logits.scatter_add_(1, peaks, torch.full((num_rows, 8), 9.0))
    logits = logits.bfloat16().float()
    state = SamplingState(num_rows + 1, VOCAB, "cpu")
    for slot in range(num_rows):
        history = torch.randint(0, VOCAB, (64,), generator=gen).tolist()
        state.set_slot(slot, params, seed=slot, prompt_ids=history[:48], output_ids=history[48:])
    slots = torch.arange(num_rows, dtype=torch.int32)
    positions = torch.randint(0, 4096, (num_rows,), generator=gen)
    return logits, slots, positions, state


def other_positions(positions: torch.Tensor, count: int) -> list[torch.Tensor]:
    """`count` more position vectors for the same rows: each keys the race's noise anew (sampling_rng), so the
    rejection's rounds decide other rows. A graph replays one draw; the mean over draws is the expected cost."""
    return [torch.randint(0, 4096, positions.shape, generator=torch.Generator().manual_seed(1000 + k))
            for k in range(count)]


def to_cuda(cpu_state: SamplingState) -> SamplingState:
    state = SamplingState(cpu_state.max_slots, VOCAB, "cuda")
    for field, tensor in vars(cpu_state).items():
        if isinstance(tensor, torch.Tensor):
            getattr(state, field).copy_(tensor)
    return state


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


def mismatches(logits, slots, positions, state, cpu_state, num_buckets, programs, race, once, reject, floor,
               search) -> str:
    """Tokens, thresholds and top-logprob rows where the GPU and the CPU reference differ, and "/" the rows whose
    threshold took the one-program search (the bucket plan's candidates did not fit)."""
    got = sampling.sample_triton(logits, slots, positions, state, MAX_TOP_LOGPROBS, num_buckets, programs,
                                 race=race, compact_once=once, reject=reject, topk_floor=floor, search=search)
    cpu = [t.cpu() for t in (logits, slots, positions)]
    ref = sampling.sample_ref(*cpu, cpu_state, MAX_TOP_LOGPROBS)
    penalized = sampling.apply_penalties_ref(cpu[0], cpu[1], cpu_state)
    fell_back = torch.zeros(len(slots), dtype=torch.int32, device=logits.device)
    threshold = sampling.keep_thresholds_triton(penalized.cuda(), slots, state, num_buckets, fell_back,
                                                programs, race, once).cpu()
    bad = int((got.token_ids.cpu() != ref.token_ids).sum()
              + (threshold != sampling.keep_thresholds(penalized, cpu[1], cpu_state)).sum()
              + (got.top_ids.cpu() != ref.top_ids).any(dim=1).sum())
    return f"{bad}/{int(fell_back.sum())}"


def undecided(logits, slots, positions, state, num_buckets, programs, race, once, reject, floor) -> int:
    """How many rows the rejection's rounds leave to the threshold search on this draw (sample_triton's steps up to
    the rounds, sampling.penalize_and_reject, with the plan kept): each costs the whole search, so a draw's time
    follows this count."""
    plan = _Plan(logits, num_buckets, programs, race, once, reject, floor)
    if not plan.reject:
        return len(slots)
    sampling.penalize_and_reject(logits, slots, positions, state, plan, MAX_TOP_LOGPROBS)
    return int((plan.reject_state[:, 0] != DECIDED.value).sum())


ENG = "eng"  # column label of the engine's programs_for(S)
PDL_LABELS = {False: "", True: "+pdl", "one_row": "+pdl1"}  # +pdl1: the engine's, at one row only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--buckets", default=str(NUM_BUCKETS), help="comma-separated bucket counts to time")
    parser.add_argument("--programs", default="engine",
                        help="comma-separated programs per multi-program kernel to time; engine: "
                             "sampling_grid.programs_for(S)")
    parser.add_argument("--pdl", default="off",
                        help="off, on, engine (one row only) or a list: the sampler's kernels with PDL")
    parser.add_argument("--race", default="row", help="row, list or row,list: the race over the row or the list")
    parser.add_argument("--compact", default="twice", help="twice, once or twice,once: the compaction's reads")
    parser.add_argument("--reject", default="0", help="rejection settings to time, comma-separated: 0 (none), R "
                                                       "rounds, Rk (top_k rows too), Rt / Rkt (the first round "
                                                       "only tests), any with s after (a launch a round, not one "
                                                       "launch for all)")
    # the engine's default since session 37; session 38's table left it out and timed top_k rows by the search
    parser.add_argument("--topk", default="floor", help="search, floor or search,floor: top_k rows by the bucket "
                                                         "search or the lane floor (sampling_floor; the default)")
    parser.add_argument("--search", default="on", help="on, off or on,off: with the threshold search's launches or "
                                                      "without them (only where no row needs them)")
    parser.add_argument("--draws", type=int, default=1,
                        help="time each cell over this many position vectors (the race's noise; each its own "
                             "graph): the mean, and a line of min-max; the rejection's cost depends on the draw")
    parser.add_argument("--no-old", action="store_true", help="skip the old sampler's column")
    parser.add_argument("--no-check", action="store_true", help="skip the CPU-reference comparison")
    parser.add_argument("--undecided", action="store_true",
                        help="a line of each draw's rows left to the search by the rejection's rounds (all rows "
                             "where a column has no rounds; - where the rows need no search)")
    args = parser.parse_args()
    pdls = {"off": False, "on": True, "engine": "one_row"}
    races, reads, topks = {"row": 0, "list": RACE_CAPACITY}, {"twice": False, "once": True}, {"search": False,
                                                                                          "floor": True}
    searches = {"on": True, "off": False}
    columns = [(int(b), None if p == "engine" else int(p), pdls[pdl], races[race], reads[once], rounds, topks[k],
                searches[search])
               for b in args.buckets.split(",") for p in args.programs.split(",") for pdl in args.pdl.split(",")
               for race in args.race.split(",") for once in args.compact.split(",")
               for rounds in args.reject.split(",")  # rounds: a BLINK_SAMPLER_REJECT setting
               for k in args.topk.split(",") for search in args.search.split(",")]
    print(f"V={VOCAB}, {torch.cuda.get_device_name()}, old = git e896288 (bench/kernels/sampling_old.py), "
          f"BLINK_SAMPLER_NOISE={sampling_noise.NOISE}, BLINK_SAMPLER_HASH={sampling_rng.HASH}")
    label = lambda nb, p, pdl, race, once, rounds, floor, search: (
        f"nb={nb} p={p or ENG}{PDL_LABELS[pdl]}{'+list' if race else ''}{'+once' if once else ''}"
        f"{f'+rj{rounds}' if rounds != '0' else ''}{'+floor' if floor else ''}{'' if search else '+nosearch'} us")
    print(f"{'scenario':<13}{'S':>5}" + "".join(f"{label(*c):>32}{'bad/fb':>7}" for c in columns)
          + f"{'old us':>10}{'speedup':>9}")
    for name in args.scenarios.split(","):
        for num_rows in args.sizes:
            logits, slots, positions, cpu_state = make_batch(num_rows, SCENARIOS[name], name.endswith("_flat"))
            state = to_cuda(cpu_state)
            gpu = (logits.cuda(), slots.cuda(), positions.cuda())
            draws = [gpu] + [(gpu[0], gpu[1], p.cuda()) for p in other_positions(positions, args.draws - 1)]
            cells, spreads, counts, first_us = "", "", "", None
            for nb, p, pdl, race, once, rounds, floor, search in columns:
                if not search and SCENARIOS[name].needs_search:  # its rows need the search: no such column
                    cells += f"{'-':>32}{'-':>7}"
                    spreads += f"{'':>32}{'':>7}"
                    counts += f"{'':>32}{'':>7}"
                    continue
                with pdl_switched(pdl, "sampler"):  # read at each launch, so at the capture
                    times = [time_graph(lambda d=d: sampling.sample_triton(  # noqa: B023
                        *d, state, MAX_TOP_LOGPROBS, nb, p, race=race, compact_once=once, reject=rounds,  # noqa: B023
                        topk_floor=floor, search=search)) for d in draws]  # noqa: B023
                    bad = "-" if args.no_check else mismatches(*gpu, state, cpu_state, nb, p, race, once, rounds,
                                                               floor, search)
                    if args.undecided:  # "-": rows that need no search
                        left = ([undecided(*d, state, nb, p, race, once, rounds if search else 0, floor)
                                 for d in draws] if SCENARIOS[name].needs_search else ["-"])
                        counts += f"{','.join(map(str, left)):>32}{'':>7}"
                us = sum(times) / len(times)
                first_us = first_us or us
                cells += f"{us:>32.1f}{bad:>7}"
                spreads += f"{f'[{min(times):.1f}-{max(times):.1f}]':>32}{'':>7}"
            old_us = (float("nan") if args.no_old else
                      time_graph(lambda: sampling_old.sample(*gpu, state, MAX_TOP_LOGPROBS)))  # noqa: B023
            speedup = old_us / first_us if first_us else float("nan")
            print(f"{name:<13}{num_rows:>5}{cells}{old_us:>10.1f}{speedup:>9.2f}", flush=True)
            if len(draws) > 1:
                print(f"{'  draws':<13}{len(draws):>5}{spreads}", flush=True)
            if args.undecided:
                print(f"{'  undecided':<13}{num_rows:>5}{counts}", flush=True)


if __name__ == "__main__":
    main()
