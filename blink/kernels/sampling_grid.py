"""The geometry and scratch of one sampling call (blink/kernels/sampling.py): how many programs its
multi-program kernels take and how much vocabulary each reads, the candidate capacities, the scratch buffers
they share, and the launch options (PDL) of its seven kernels."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton

from blink.kernels.pdl import sampler_pdl_for
from blink.kernels.sampling_bucket import NUM_BUCKETS
from blink.kernels.sampling_plan import COUNTERS, PLAN_WORDS, POOL_QUEUE, QUEUE_PER_ROW, REJECT_WORDS, log2_buckets
from blink.kernels.sampling_race import race_block
from blink.kernels.sampling_reject_pool import CELL_WORDS
from blink.kernels.sampling_topk import TOP_LANES, TOP_WIDTH


def _setting(name: str, choices: dict[str, bool], default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return choices[value]


# Two levers of issue 17, read once at import (sample_triton's `race` / `compact_once` override them):
# BLINK_SAMPLER_RACE = "row" | "list", the race over a list of the kept tokens (sampling_race) instead of a second
# stream of the row (a row whose filter keeps more than RACE_CAPACITY tokens, a flat row's top_p, still streams);
# BLINK_SAMPLER_COMPACT = "twice" | "once", the compaction's reads of its chunk (sampling_compact). Both new ways
# are the defaults since the H200 timed them (perf.md, session 17: top_p at 32 rows 128.7 -> 107.6 us, top_k
# 119.3 -> 97.8, top_p at one row 42.4 -> 40.6; greedy +0.6 us, a flat top_p row at one row +3.4 us).
RACE_CAPACITY = 16384
# BLINK_SAMPLER_TOPK = "search" | "floor": top_k rows without min_p take the lane floor (sampling_floor) instead of
# the bucket search. Session 37 (H200, mean of 2 draws, reject 0, us at 1 / 8 / 32 rows): top_k 39.8 / 51.6 / 98.3
# -> 26.8 / 36.5 / 54.4, top_k + top_p 54.9 / 107.2 -> 37.1 / 55.0 at 8 / 32, greedy +1.0; 0 mismatches.
# BLINK_SAMPLER_SEARCHLESS = "off" | "on": the engines capture each decode bucket a second time without the search
# (sample's search=False) and launch that graph for steps whose rows need none (SamplingParams.needs_search: no
# filter, no top-K logprobs). Session 39 (H100, mean of 2 draws, us at 1 / 8 / 32 rows, the search's launches and
# none): greedy 16.9 / 23.2 / 31.3 -> 12.6 / 16.2 / 22.7, temperature 19.3 / 26.2 / 40.6 -> 14.0 / 18.7 / 32.4.
KNOBS = {"BLINK_SAMPLER_RACE": ({"row": False, "list": True}, "list"),
         "BLINK_SAMPLER_COMPACT": ({"twice": False, "once": True}, "once"),
         "BLINK_SAMPLER_TOPK": ({"search": False, "floor": True}, "floor"),
         "BLINK_SAMPLER_SEARCHLESS": ({"off": False, "on": True}, "on")}  # (choices, default)
_RACE_DEFAULT = _setting("BLINK_SAMPLER_RACE", *KNOBS["BLINK_SAMPLER_RACE"])
_ONCE_DEFAULT = _setting("BLINK_SAMPLER_COMPACT", *KNOBS["BLINK_SAMPLER_COMPACT"])
_FLOOR_DEFAULT = _setting("BLINK_SAMPLER_TOPK", *KNOBS["BLINK_SAMPLER_TOPK"])
SEARCHLESS_DEFAULT = _setting("BLINK_SAMPLER_SEARCHLESS", *KNOBS["BLINK_SAMPLER_SEARCHLESS"])


def race_capacity(vocab_size: int, race: int | None = None) -> int:
    """RACE of the launches: the listed tokens per row (0: every row races over its whole row). race: a power of
    two, 0, or None for BLINK_SAMPLER_RACE's choice."""
    if race is None:
        race = RACE_CAPACITY if _RACE_DEFAULT else 0
    assert race >= 0 and race & (race - 1) == 0, "race: 0 or a power of two"
    return min(race, triton.next_power_of_2(vocab_size))


# BLINK_SAMPLER_REJECT = the rejection before the threshold search (sampling_reject), read once at import like the
# two above (sample_triton's `reject` overrides it): "R" rounds for rows with top_p or min_p and no top_k, "Rk" for
# top_k-only rows too (a top_k row accepts a candidate with the top_k set's share of the mass: few rounds decide it
# on a real model's rows, many on flat ones, and a row left pending costs the whole search), "0" none; a "t" after
# either: the first round only tests the first candidate (float sums, no race: a refused one waits for the second
# round's race); then a "p": the rounds after the first are spread over every program of the launch in small units
# (sampling_reject_pool) instead of each row's own; an "s" last: a launch a round on the GPU too (with "p": one for
# the first round, one for the rest; else the rounds share one launch there, sampling_reject_sync; the interpreter
# always launches each round). Unset: one round up to 8 rows
# (FEW_ROWS_REJECT); three at 9-16 rows (MID_ROWS_REJECT); three pooled at 17-128 (MANY_ROWS_REJECT); none else.
REJECT_ROUNDS_MAX = 8


class RejectSetting(NamedTuple):
    rounds: int = 0  # 0: no rejection
    top_k: bool = False  # top_k-only rows taken too
    test_first: bool = False  # the first round tests its candidate only
    separate: bool = False  # a launch a round (the GPU's default: all rounds in one launch)
    pool: bool = False  # the rounds after the first over the launch's whole pool of programs (sampling_reject_pool)


# Session 34 (H100, one run, V = 128k): one round at one row took top_p 41.7 -> 31.9 us for greedy +2.0, min_p +0.8,
# top_k +1.5; at 8 / 32 rows it cost min_p 41.1 -> 54.8 / 77.1 -> 101.4 and top_p at 32 109.6 -> 129.2 (perf.md).
# Session 35 (H200, one run) took top_k rows too at one row ("1k": top_k 40.2 -> 31.3 us with the bucket search).
# With the lane floor (sampling_floor) that saving is gone: session 39 (H100, mean of 3 draws, us, none / "1k" /
# "1"): top_k 27.1 / 34.2 / 28.9, top_k + top_p 28.3 / 30.6 / 30.3; so one row takes the few rows' setting.
# Session 36 (mean of 4 draws, us at 8 / 16 rows; none -> one round, H100): top_p 57.1 -> 51.5 / 80.9 -> 86.4, min_p
# 41.0 -> 40.4 / 56.3 -> 52.5, top_k +2.6 / +2.2, greedy +2.7 / +2.0. The rule set before the run (greedy and top_k
# pay <= 3 us, top_p and min_p gain) held at 8 rows and failed at 16 (top_p), so plans of 2-8 rows (1-8 since
# session 39) take one. The H200 at 8 rows, with the first round's bounded total: top_p 56.4 -> 52.3, min_p
# 40.3 -> 41.5, top_k +2.5, greedy +2.8.
FEW_ROWS_REJECT, FEW_ROWS_MAX = RejectSetting(1), 8
# Session 37 (H200, mean of 3 draws, 32 rows, rounds in one launch): two rounds took top_p 107.9 -> 94.3 us, min_p
# 75.6 -> 71.6, for greedy +2.9 (a launch a round: +3.8); the rule written for a first round that only tests ("3t":
# top_p 99.5, min_p 78.0, so it failed) holds for "2": top_p and min_p gain, greedy pays <= 3.5 us. Plans of 17-32
# rows share 32 rows' grid (512 programs, all resident at once); 9-16 and above 32 were not timed with one launch.
# Session 42 (H100, tools/sampler_draws.py, each draw timed alone, top_p at 32 rows): with two rounds a draw costs
# 72.2 us when one round decides every row, 79-88 when a second round runs for 1-6 rows, and 138-140 when a row is
# left to the search (3 of 16 draws); three rounds take those three to 96-98 and the others +1.5-2 us: the mean of
# 16 draws 94.9 -> 88.6 us; on flat rows 101.4 -> 94.2 (16 draws, 3 left a row with two); min_p +0.7, greedy +0.3.
# Session 47 (H100, tools/sampler_draws.py, means; none / three rounds / three with the later ones pooled, "3p"):
# top_p at 16 rows 81.2 / 63.1 / 66.3 us (6 draws), at 32 86.9 for "3" -> 82.7 for "3p" (12; flat rows 91.9 -> 84.4),
# at 64 190.4 / 142.1 / 133.7, at 128 336.7 / 246.6 / 222.7 (6); they cost a plan without top_p rows: greedy
# +4.1 / +6.5 / +6.2 us at 16 / 64 / 128 for "3" (+2 more pooled), top_k +4.0 / +10.5 / +16.2 (2 draws). A batch
# of greedy rows alone takes the searchless graph, without any of it. Device self-test 13/13 with "3p" at every
# size. So 9-16 rows take three rounds, 17-128 three pooled; above 128 was not timed.
MID_ROWS_REJECT, MID_ROWS = RejectSetting(3), range(9, 17)
MANY_ROWS_REJECT, MANY_ROWS = RejectSetting(3, pool=True), range(17, 129)


def reject_setting(value: int | str) -> RejectSetting:
    """The setting of 3, "3", "3k", "3t", "3kt" or any of them with a "p", an "s" or "ps" after; ValueError if it
    is none."""
    text = str(value)
    flags = {}
    for flag, name in (("s", "separate"), ("p", "pool"), ("t", "test_first"), ("k", "top_k")):  # from the end
        flags[name] = text.endswith(flag)
        text = text[:-1] if flags[name] else text
    if not text.isdigit() or int(text) > REJECT_ROUNDS_MAX:
        raise ValueError(f"BLINK_SAMPLER_REJECT must be rounds from 0 to {REJECT_ROUNDS_MAX}, optionally followed "
                         f"by k (top_k rows too), t (the first round tests only), p (the later rounds over every "
                         f"program) and s (a launch a round), got {value!r}")
    rounds = int(text)
    return RejectSetting(rounds, **{name: on and rounds > 0 for name, on in flags.items()})


_REJECT_ENV = os.environ.get("BLINK_SAMPLER_REJECT")
_REJECT_DEFAULT = None if _REJECT_ENV is None else reject_setting(_REJECT_ENV)  # None: by the plan's rows


def reject_plan(race: int, value: int | str | None = None, rows: int = 1) -> RejectSetting:
    """The rejection of a plan of `rows` rows (0 rounds: none); it needs the list race (race > 0)."""
    if value is not None:
        setting = reject_setting(value)
    elif _REJECT_DEFAULT is not None:
        setting = _REJECT_DEFAULT
    else:
        setting = (FEW_ROWS_REJECT if rows <= FEW_ROWS_MAX else MID_ROWS_REJECT if rows in MID_ROWS
                   else MANY_ROWS_REJECT if rows in MANY_ROWS else RejectSetting())
    return setting if race > 0 else RejectSetting()


# Tokens a unit of the rejection's pool rounds (sampling_reject_pool), 63 units a row at V = 128k, and the launch's
# helpers (programs past the rows' that run no first round). Not settled yet (session 43).
POOL_UNIT, POOL_HELPERS = 2048, 256

CANDIDATES = 4096  # per row, for the threshold and the top-K searches (more: the one-program fallback)
SHORT_SORT = 256  # fewer candidates than this (the usual case) take a short sort

# Programs per multi-program kernel (all rows together), where the 2k-token smallest chunk allows. More, shorter
# programs hide latency but repeat each program's fixed scans: on the H200 at V = 128k (docs/perf.md, session 10)
# 512 beat 256 at 32 rows (top_k 145 -> 129 us) and 1,024 beat 512 at 128 rows (top_p 477 -> 431); at one row
# every count gives the same 2k chunks. Between those sizes the steps are a guess.
PROGRAMS = 256


def programs_for(num_rows: int) -> int:
    """The engine's programs per multi-program kernel for a batch of num_rows (a graph bucket fixes it)."""
    return PROGRAMS if num_rows <= 16 else 2 * PROGRAMS if num_rows <= 32 else 4 * PROGRAMS


def _chunk_size(num_rows: int, vocab_size: int, programs: int | None = None) -> int:
    """Vocabulary per multi-program kernel: about `programs` programs in all, 2k..32k tokens each."""
    programs = programs or programs_for(num_rows)
    smallest = max(16, min(2048, triton.next_power_of_2(vocab_size) // 4))
    wanted = triton.next_power_of_2(triton.cdiv(vocab_size, max(1, programs // num_rows)))
    return max(smallest, min(32768, wanted))


def _row_block(vocab_size: int) -> int:
    """BLOCK of the one-program-per-row searches (a few blocks per row even in small tests)."""
    return max(16, min(4096, triton.next_power_of_2(vocab_size) // 4))


class _Plan:
    """The grid and one call's scratch (allocated per call: inside a CUDA graph, once at capture)."""

    def __init__(self, logits: torch.Tensor, num_buckets: int = NUM_BUCKETS, programs: int | None = None,
                 race: int | None = None, compact_once: bool | None = None, reject: int | str | None = None,
                 topk_floor: bool | None = None):
        num_rows, vocab_size = logits.shape
        self.num_buckets, self.log2_buckets = num_buckets, log2_buckets(num_buckets)
        device = logits.device
        self.chunk = _chunk_size(num_rows, vocab_size, programs)
        self.num_chunks = triton.cdiv(vocab_size, self.chunk)
        self.chunks_pad = triton.next_power_of_2(self.num_chunks)
        self.block = min(self.chunk, 1024)
        self.cand = min(CANDIDATES, triton.next_power_of_2(vocab_size))
        self.small = min(SHORT_SORT, self.cand)
        self.grid = (num_rows, self.num_chunks)
        self.scratch = torch.empty_like(logits)  # the one-program searches' gathers
        self.part_f32 = torch.empty(3, num_rows, self.num_chunks, dtype=torch.float32, device=device)
        self.part_i32 = torch.empty(5, num_rows, self.num_chunks, dtype=torch.int32, device=device)
        self.top_keys = torch.empty(num_rows, self.num_chunks * TOP_WIDTH, dtype=torch.int32, device=device)
        self.part_total = torch.empty(num_rows, self.num_chunks, dtype=torch.int64, device=device)
        self.hist = torch.empty(num_rows, 2 * num_buckets, dtype=torch.int32, device=device)  # coarse, fine
        self.sums = torch.empty(num_rows, 2, dtype=torch.int64, device=device)
        self.counters = torch.empty(num_rows, COUNTERS.value, dtype=torch.int32, device=device)
        self.row_plans = torch.empty(num_rows, PLAN_WORDS.value, dtype=torch.int64, device=device)  # refine's
        self.fell_back = torch.empty(num_rows, dtype=torch.int32, device=device)  # rows the resolve searched
        self.cand_i32 = torch.empty(3, num_rows, self.cand, dtype=torch.int32, device=device)
        self.race = race_capacity(vocab_size, race)
        self.race_block = race_block(self.race, self.num_chunks)
        self.race_ids = torch.empty(num_rows, max(self.race, 1), dtype=torch.int32, device=device)  # the lists
        self.race_count = torch.empty(num_rows, dtype=torch.int32, device=device)  # the resolve's marks
        (self.reject, self.reject_top_k, self.reject_test_first, self.reject_separate,
         self.reject_pool_rounds) = reject_plan(self.race, reject, num_rows)
        # the pool's units (POOL_UNIT tokens, a quarter chunk in small plans) and its cells per row: the race key,
        # the weight and the count above the candidate
        self.pool_unit = max(16, min(POOL_UNIT, self.chunk // 4))
        self.pool_helpers = POOL_HELPERS
        self.reject_pool = torch.empty(num_rows, CELL_WORDS.value, dtype=torch.int64, device=device)
        self.pool_words = torch.empty(POOL_QUEUE.value + QUEUE_PER_ROW.value * num_rows, dtype=torch.int32,
                                      device=device)
        self.reject_state = torch.empty(num_rows, REJECT_WORDS.value, dtype=torch.int64, device=device)
        # per chunk: the penalties kernel's first race and float mass, then a round's race, count and weights
        # (above, total)
        self.reject_first_best, self.reject_first_mass, self.reject_best = torch.empty(
            3, num_rows, self.num_chunks, dtype=torch.float32, device=device)
        self.reject_first_token, self.reject_token, self.reject_count = torch.empty(
            3, num_rows, self.num_chunks, dtype=torch.int32, device=device)
        self.reject_weight = torch.empty(2, num_rows, self.num_chunks, dtype=torch.int64, device=device)
        self.compact_once = _ONCE_DEFAULT if compact_once is None else compact_once
        self.topk_floor = _FLOOR_DEFAULT if topk_floor is None else topk_floor
        self.floor_keys = torch.empty(num_rows, self.num_chunks * TOP_LANES, dtype=torch.int32, device=device)
        self.chunk_hist = torch.empty(num_rows, self.num_chunks, 2 * num_buckets, dtype=torch.int32, device=device) \
            if self.compact_once else torch.empty(1, dtype=torch.int32, device=device)  # coarse, fine per chunk
        # the seven launches' PDL options, decided once per call: each kernel then waits first thing in every
        # program (pdl_wait), so it may launch early
        use_pdl = sampler_pdl_for(logits)
        self.pdl = {"USE_PDL": use_pdl, "launch_pdl": use_pdl}

    @property
    def row_max(self) -> torch.Tensor:  # chunk maxima of the processed rows (keys)
        return self.part_i32[3]

    @property
    def kept_min(self) -> torch.Tensor:  # chunk minima of the tokens min_p keeps (keys)
        return self.part_i32[4]
