"""The race over a list of the kept tokens (issue 17; BLINK_SAMPLER_RACE=list, sampling_grid.race_capacity).

The choose pass streamed every row once more after the compaction, for the race and the raw log-sum-exp. With
the list race, rows with a filter get both elsewhere: the penalties kernel, which reads such a row anyway for
its chunk maxima, also keeps the raw log-sum-exp and largest key per chunk (lse_step, the choose kernel's own
steps, so the partials are the same bits); the compaction also lists the ids of every token the threshold can
keep (min_p's kept tokens before the fine range and in it), at most RACE per row; the resolve marks the rows
whose list is complete (the plan sound, the list within RACE) with its length, the others with -1. The choose
kernel then races only over a marked row's list, spread over the row's programs; unmarked rows (no filter,
greedy, flat rows that keep more than RACE tokens, rows that fell back) stream as before. Every token outside
the list lies below the threshold, and the list's scores are sampling_ref's formula on the same values: the
same token, ties to the lowest id as argmax does.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_noise import race_score
from blink.kernels.sampling_select import canonical, sortable_key

_INT32_MIN = tl.constexpr(-0x7FFFFFFF - 1)
LIST_COUNTER = tl.constexpr(3)  # the word of the selection's counters (sampling_plan.COUNTERS) the list takes


@triton.jit
def lse_step(run_max, run_sum, largest, x, valid):
    """One block of the online log-sum-exp of the raw logits, per lane, and their largest key."""
    new_max = tl.maximum(run_max, x)
    pivot = tl.where(new_max == float("-inf"), 0.0, new_max)  # all -inf so far: both terms 0, no NaN
    run_sum = run_sum * tl.exp(run_max - pivot) + tl.exp(x - pivot)
    largest = tl.maximum(largest, tl.where(valid, sortable_key(canonical(x)), _INT32_MIN))
    return new_max, run_sum, largest


@triton.jit
def store_lse(part_max_ptr, part_sum_ptr, part_largest_ptr, out, run_max, run_sum, largest):
    """The chunk's log-sum-exp partials (max, sum scaled to it) and largest key, for the finish kernel."""
    chunk_max = tl.max(run_max, 0)
    scale = tl.exp(run_max - tl.where(chunk_max == float("-inf"), 0.0, chunk_max))
    tl.store(part_max_ptr + out, chunk_max)
    tl.store(part_sum_ptr + out, tl.sum(run_sum * scale, 0))
    tl.store(part_largest_ptr + out, tl.max(largest, 0))


@triton.jit
def list_fits(j_lo, j_hi, num_above, num_candidates, CAND: tl.constexpr, RACE: tl.constexpr):
    """Whether the compaction lists a planned row: its candidates are gathered (or it has no candidate range)
    and all of min_p's kept tokens from the top to the fine range's end fit in RACE."""
    fits = ((j_lo > j_hi) | (num_candidates <= CAND)) & (num_above + num_candidates <= RACE)
    return fits & (RACE > 0)


@triton.jit
def scan_slots(inside, listed, RACE: tl.constexpr):
    """Inclusive running counts of a block's candidates and listed tokens, and their totals: one scan and one
    reduction for both lists (a block holds at most 65,535 of either)."""
    if RACE > 0:
        both = tl.cumsum(inside.to(tl.int32) + (listed.to(tl.int32) << 16), 0)
        totals = tl.max(both, 0)
        return both & 0xFFFF, both >> 16, totals & 0xFFFF, totals >> 16
    else:
        return tl.cumsum(inside.to(tl.int32), 0), 0, tl.sum(inside.to(tl.int32), 0), 0


@triton.jit
def race_over_list(ids_row, count, score_row, threshold, inv_temperature, hash_of_row, chunk, vocab_size: tl.constexpr,
                   NUM_CHUNKS: tl.constexpr, KEY_BYTES: tl.constexpr, RACE: tl.constexpr, RACE_BLOCK: tl.constexpr):
    """This program's share of a listed row (blocks chunk, chunk + NUM_CHUNKS, ...): its best score and the lowest
    id that reaches it (vocab_size if nothing is finite), as the row race's per-chunk result."""
    best = tl.full([RACE_BLOCK], float("-inf"), tl.float32)
    best_token = tl.full([RACE_BLOCK], vocab_size, tl.int32)
    for start in range(0, RACE, NUM_CHUNKS * RACE_BLOCK):
        i = start + chunk * RACE_BLOCK + tl.arange(0, RACE_BLOCK)
        valid = i < count
        ids = tl.load(ids_row + i, mask=valid, other=0)
        x = tl.load(score_row + ids, mask=valid, other=float("-inf"))
        score = race_score(x * inv_temperature, valid & (x >= threshold), hash_of_row, ids, KEY_BYTES)
        # the list is in no particular order: equal finite scores go to the lower id
        take = (score > best) | ((score == best) & (score > float("-inf")) & (ids < best_token))
        best = tl.where(take, score, best)
        best_token = tl.where(take, ids, best_token)
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_token, vocab_size), 0)


def race_block(race: int, num_chunks: int) -> int:
    """RACE_BLOCK: a row's list over its programs in one block each where 512 lanes allow (1,024 took the choose
    kernel from 96 to 107 registers in sm_90's build, 512 to 95: the streaming rows' occupancy stays)."""
    return max(16, min(512, triton.next_power_of_2(triton.cdiv(max(race, 1), num_chunks))))
