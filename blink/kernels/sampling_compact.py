"""Step 3 of the keep thresholds (sampling_bucket's pipeline): the compaction. Each program copies its chunk's
tokens in the row's fine range (the threshold's candidates, as keys) into the row's candidate list, adds the exact
top_p weight of the coarse range's tokens before the fine range to the row's second sum, and with RACE > 0 lists
the ids of every token the threshold may keep (sampling_race).

Where a chunk's tokens go in the lists, two ways (BLINK_SAMPLER_COMPACT, sampling_grid.compact_once):
  twice (the default): count the chunk, reserve its slots with one atomic per list, read the chunk again to copy
    (the second read hits L2; an atomic per block inside the loop had put its round trip on every iteration's
    critical path);
  once: the bucket and refine kernels kept each chunk's coarse and fine histograms, cumulative (chunk_hist
    [S, P, 2 * NB]), so a program sums the chunks before its own at the lists' bounds and knows its offsets: one
    read.
Either way the lists hold the same tokens (in another order: the resolve sorts, the race takes the lowest id).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_bucket import _classify, _row_scale, _row_source, _row_top, row_params, top_p_weight
from blink.kernels.sampling_floor import compact_floor_chunk, floor_row, lane_floor
from blink.kernels.sampling_plan import COUNTERS, PLAN_WORDS, load_row_plan
from blink.kernels.sampling_race import LIST_COUNTER, list_fits, scan_slots
from blink.kernels.sampling_select import sortable_key
from blink.kernels.sampling_topk import asks_for_logprobs, compact_top_chunk


@triton.jit
def _select(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r, span, f_lo, f_hi, listing,
            vocab_size: tl.constexpr, NB: tl.constexpr):
    """A block's tokens: value, candidate (in the fine range), listed (kept by min_p, from the top to the fine
    range's end) and early (in the coarse range, before the fine one: its weight goes to the second sum)."""
    x, kept, coarse, in_range, fine = _classify(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r, span,
                                                vocab_size, NB)
    inside = in_range & (fine >= f_lo) & (fine <= f_hi)
    listed = listing & kept & ((coarse < j_lo) | (in_range & (fine <= f_hi)))
    return x, inside, listed, in_range & (fine < f_lo)


@triton.jit
def _copy_block(x, offs, inside, listed, cand_row, list_row, cand_base, list_base, CAND: tl.constexpr,
                RACE: tl.constexpr):
    """Store a block's candidates and listed ids from the given slots on; the slots after them."""
    inside_rank, listed_rank, num_inside, num_listed = scan_slots(inside, listed, RACE)
    slot = cand_base + inside_rank - 1
    tl.store(cand_row + slot, sortable_key(x), mask=inside & (slot < CAND))
    if RACE > 0:
        list_slot = list_base + listed_rank - 1
        tl.store(list_row + list_slot, offs, mask=listed & (list_slot < RACE))
    return cand_base + num_inside, list_base + num_listed


@triton.jit
def _add_weight_before(sums_ptr, row, before):
    """The exact weight of this chunk's coarse-range tokens before the fine range, into the row's second sum."""
    weight_before = tl.sum(before, 0)
    if weight_before != 0:
        tl.atomic_add(sums_ptr + row * 2 + 1, weight_before)


@triton.jit
def _chunk_offsets(chunk_hist_ptr, row, chunk, j_lo, j_hi, f_lo, f_hi, NB: tl.constexpr, P: tl.constexpr,
                   P_PAD: tl.constexpr, RACE: tl.constexpr):
    """The candidates and listed tokens of the row's chunks before this one, from their cumulative histograms:
    a few values per chunk (a [P, NB] tile took 224 registers at one row's 63 chunks)."""
    c = tl.arange(0, P_PAD)
    cumulative = chunk_hist_ptr + (row * P + c) * (2 * NB)  # coarse, then fine, per chunk
    earlier = (c < chunk) & (j_lo <= j_hi)
    through_hi = tl.load(cumulative + NB + tl.maximum(f_hi, 0), mask=earlier & (f_hi >= 0), other=0)
    before_lo = tl.load(cumulative + NB + tl.maximum(f_lo - 1, 0), mask=earlier & (f_lo > 0), other=0)
    num_candidates = tl.sum(through_hi - before_lo, 0)
    num_listed = tl.zeros([], tl.int32)
    if RACE > 0:  # the kept tokens of the coarse buckets before j_lo, then the fine ones through f_hi
        above = tl.load(cumulative + tl.minimum(j_lo, NB) - 1, mask=(c < chunk) & (j_lo > 0), other=0)
        num_listed = tl.sum(above + through_hi, 0)
    return num_candidates, num_listed


@triton.jit
def _compact_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                    min_p_ptr, reject_ptr, key_max_ptr, plan_ptr, sums_ptr, counter_ptr, cand_ptr, num_logprobs_ptr,
                    top_keys_ptr, part_smallest_ptr, cand_key_ptr, cand_id_ptr, race_ids_ptr, chunk_hist_ptr,
                    floor_keys_ptr, vocab_size: tl.constexpr, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                    CAND: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                    RACE: tl.constexpr = 0, ONCE: tl.constexpr = False, REJECT: tl.constexpr = False,
                    FLOOR: tl.constexpr = False, USE_PDL: tl.constexpr = False):
    """The threshold's candidates (filtered rows), with RACE > 0 the race's list and, with K > 0, the top-K
    logprobs' candidates (rows that ask). FLOOR: the rows that take the lane floor copy the tokens at or above it
    (sampling_floor)."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, REJECT)
    top, finite = _row_top(key_max_ptr, row, P, P_PAD)
    by_floor = filtered & FLOOR & floor_row(top_k, min_p, vocab_size, P)
    if by_floor & finite:
        compact_floor_chunk(_row_source(logits_ptr, processed_ptr, row, processed, vocab_size), row, chunk,
                            lane_floor(floor_keys_ptr, row, top_k, P, P_PAD), counter_ptr, cand_ptr + row * CAND,
                            race_ids_ptr + row * RACE, vocab_size, CAND, CHUNK, BLOCK, RACE)
    elif filtered & finite:
        _, j_lo, j_hi, r, f_lo, f_hi, num_above, num_candidates, _ = load_row_plan(plan_ptr + row * PLAN_WORDS)
        gather = (j_lo <= j_hi) & (num_candidates <= CAND)  # else the resolve kernel searches the whole row
        listing = list_fits(j_lo, j_hi, num_above, num_candidates, CAND, RACE)
        if gather | listing:
            span = j_hi - j_lo + 1
            src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed,
                                                             temperature, min_p, top, vocab_size)
            cand_row = cand_ptr + row * CAND
            list_row = race_ids_ptr + row * RACE
            before = tl.zeros([BLOCK], tl.int64)
            if ONCE:
                cand_base, list_base = _chunk_offsets(chunk_hist_ptr, row, chunk, j_lo, j_hi, f_lo, f_hi, NB, P,
                                                      P_PAD, RACE)
                for start in range(0, CHUNK, BLOCK):
                    offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                    x, inside, listed, early = _select(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r,
                                                            span, f_lo, f_hi, listing, vocab_size, NB)
                    if top_p < 1.0:
                        before += tl.where(early, top_p_weight(x, inv_temperature, s_max), 0)
                    cand_base, list_base = _copy_block(x, offs, inside, listed, cand_row, list_row, cand_base,
                                                       list_base, CAND, RACE)
                _add_weight_before(sums_ptr, row, before)
            else:
                num_inside = tl.zeros([BLOCK], tl.int32)
                num_listed = tl.zeros([BLOCK], tl.int32)
                for start in range(0, CHUNK, BLOCK):
                    offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                    x, inside, listed, early = _select(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r,
                                                            span, f_lo, f_hi, listing, vocab_size, NB)
                    num_inside += inside.to(tl.int32)
                    if RACE > 0:
                        num_listed += listed.to(tl.int32)
                    if top_p < 1.0:
                        before += tl.where(early, top_p_weight(x, inv_temperature, s_max), 0)
                _add_weight_before(sums_ptr, row, before)  # before the second pass: its registers are free there
                total_inside = tl.sum(num_inside, 0)
                total_listed = tl.zeros([], tl.int32)
                if RACE > 0:
                    total_listed = tl.sum(num_listed, 0)
                if (total_inside > 0) | (total_listed > 0):
                    cand_base = tl.zeros([], tl.int32)
                    if total_inside > 0:
                        cand_base = tl.atomic_add(counter_ptr + row * COUNTERS, total_inside)
                    list_base = tl.zeros([], tl.int32)
                    if total_listed > 0:
                        list_base = tl.atomic_add(counter_ptr + row * COUNTERS + LIST_COUNTER, total_listed)
                    for start in range(0, CHUNK, BLOCK):
                        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                        x, inside, listed, _early = _select(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r,
                                                            span, f_lo, f_hi, listing, vocab_size, NB)
                        cand_base, list_base = _copy_block(x, offs, inside, listed, cand_row, list_row, cand_base,
                                                           list_base, CAND, RACE)
    if K > 0:
        if asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
            compact_top_chunk(logits_ptr, row, chunk, top_keys_ptr, part_smallest_ptr, counter_ptr, cand_key_ptr,
                              cand_id_ptr, vocab_size, K, P, P_PAD, CAND, CHUNK, BLOCK)
