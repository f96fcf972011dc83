"""Step 4 of the keep thresholds (sampling_bucket's pipeline): one program per row reads the row's plan, sorts
the compaction's candidates and applies sampling_ref's definition to them, offset by the exact count and weight
of the kept tokens before them (the same threshold, ties included). A row whose plan did not fit its
candidates, or whose maximum is not finite, runs sampling_select's one-program search instead. With the rejection
(sampling_reject), a row it decided gets its chosen token's value as the threshold and that token as its race list."""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_bucket import _INT32_MAX, _INT32_MIN, _row_source, _row_top, row_params, top_p_weight
from blink.kernels.sampling_floor import floor_row
from blink.kernels.sampling_plan import COUNTERS, PLAN_WORDS, REJECT_WORDS, decided, load_row_plan
from blink.kernels.sampling_race import list_fits
from blink.kernels.sampling_select import key_value, search_threshold


@triton.jit
def _resolve_candidates(cand_row, num_candidates, num_above, mass_above, floor, budget, top_k_active, top_k, top_p,
                        inv_temperature, s_max, SIZE: tl.constexpr):
    """sampling_ref's threshold over the sorted candidates (SIZE >= num_candidates), offset by the
    num_above tokens of weight mass_above before them. Returns (key, 1), or (_, 0) if it fell outside."""
    i = tl.arange(0, SIZE)
    ordered = tl.sort(tl.load(cand_row + i, mask=i < num_candidates, other=_INT32_MIN), 0, descending=True)
    searched = tl.full([], 1, tl.int32)
    if top_k_active:  # the k-th largest (its ties stay too)
        floor = tl.max(tl.where(i == top_k - 1 - num_above, ordered, _INT32_MIN), 0)
    if top_p < 1.0:
        in_set = (i < num_candidates) & (ordered >= floor)
        weight = tl.where(in_set, top_p_weight(key_value(ordered), inv_temperature, s_max), 0)
        if top_k_active:  # j_lo is 0: the whole top_k set is here
            budget = top_p.to(tl.float64) * tl.sum(weight, 0).to(tl.float64)
        mass_before = mass_above + tl.cumsum(weight, 0) - weight
        kept = in_set & (mass_before.to(tl.float64) < budget)
        position = tl.maximum(num_above + tl.sum(kept.to(tl.int32), 0), 1) - 1 - num_above
        searched = ((position >= 0) & (position < num_candidates)).to(tl.int32)  # always: the plan is sound
        floor = tl.max(tl.where(i == position, ordered, _INT32_MIN), 0)
    return floor, searched


@triton.jit
def _resolve_kernel(logits_ptr, processed_ptr, scratch_ptr, out_ptr, fell_back_ptr, slots_ptr, flags_ptr,
                    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, key_max_ptr, kept_min_ptr, plan_ptr,
                    sums_ptr, cand_ptr, race_count_ptr, counter_ptr, vocab_size: tl.constexpr, P: tl.constexpr,
                    P_PAD: tl.constexpr, CAND: tl.constexpr, SMALL: tl.constexpr, BLOCK: tl.constexpr,
                    RACE: tl.constexpr = 0, REJECT: tl.constexpr = False, FLOOR: tl.constexpr = False,
                    USE_PDL: tl.constexpr = False):
    """out[row] = sampling_ref.keep_thresholds; rows with no filter write -inf. fell_back[row]: 1 where the
    row took the one-program search (the plan's candidates did not fit), else 0. RACE > 0: race_count[row] is
    the length of the row's race list where it holds every kept token (the threshold came from the plan), else
    -1 (sampling_race). FLOOR: the rows that took the lane floor (sampling_floor) resolve the compaction's copy of
    the tokens at or above it, with no plan."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, REJECT)
    threshold = tl.full([], float("-inf"), tl.float32)
    fell_back = tl.zeros([], tl.int32)
    listed = tl.full([], -1, tl.int32)
    if filtered:
        top, finite = _row_top(key_max_ptr, row, P, P_PAD)
        zero = tl.zeros([], tl.int32)
        if FLOOR & floor_row(top_k, min_p, vocab_size, P):  # the copy of the tokens at or above the lane floor
            # (sampling_floor): at least top_k of them, no plan, nothing counted before them
            num_candidates = tl.load(counter_ptr + row * COUNTERS)
            top_k_active, num_above, mass_above, budget = zero == 0, zero, zero.to(tl.int64), zero.to(tl.float64)
            floor, gathered, sound = tl.full([], _INT32_MIN, tl.int32), finite, zero == 0
            complete = (num_candidates <= RACE) & (RACE > 0)
        else:  # the bucket plan's candidates; the refine kernel planned finite rows only: the others' words are
            # never read
            c = tl.arange(0, P_PAD)
            floor = tl.min(tl.load(kept_min_ptr + row * P + c, mask=c < P, other=_INT32_MAX), 0)  # smallest kept
            top_k_active, j_lo, j_hi, _, f_lo, f_hi, num_above, num_candidates, total = load_row_plan(
                plan_ptr + row * PLAN_WORDS)
            budget = top_p.to(tl.float64) * total.to(tl.float64)  # plan_coarse's
            mass_above = tl.load(sums_ptr + row * 2) + tl.load(sums_ptr + row * 2 + 1)
            gathered, sound = finite & (j_lo <= j_hi), f_lo <= f_hi  # f_lo <= f_hi: the plan is sound
            complete = list_fits(j_lo, j_hi, num_above, num_candidates, CAND, RACE)
        searched = finite.to(tl.int32)
        if gathered:
            searched = ((num_candidates <= CAND) & sound).to(tl.int32)
            if searched:
                inv_temperature = tl.math.div_rn(1.0, temperature)
                s_max = key_value(top) * inv_temperature
                cand_row = cand_ptr + row * CAND
                if num_candidates <= SMALL:  # the usual case: a short sort
                    floor, searched = _resolve_candidates(cand_row, num_candidates, num_above, mass_above, floor,
                                                          budget, top_k_active, top_k, top_p, inv_temperature, s_max,
                                                          SMALL)
                else:
                    floor, searched = _resolve_candidates(cand_row, num_candidates, num_above, mass_above, floor,
                                                          budget, top_k_active, top_k, top_p, inv_temperature, s_max,
                                                          CAND)
        threshold = key_value(floor)
        listed = tl.where(finite & (searched != 0) & complete, num_above + num_candidates, -1)  # what was listed
        if searched == 0:
            fell_back = tl.full([], 1, tl.int32)
            src = _row_source(logits_ptr, processed_ptr, row, processed, vocab_size)
            threshold = search_threshold(src, scratch_ptr + row.to(tl.int64) * vocab_size, temperature, top_k, top_p,
                                         min_p, vocab_size, BLOCK)
    if REJECT:
        if decided(reject_ptr, row):  # the rejection chose the token: the race's list is that one (sampling_reject)
            chosen = tl.load(reject_ptr + row * REJECT_WORDS + 1)
            threshold = tl.load(_row_source(logits_ptr, processed_ptr, row, processed, vocab_size) + chosen)
            listed = tl.full([], 1, tl.int32)
    tl.store(out_ptr + row, threshold)
    tl.store(fell_back_ptr + row, fell_back)
    if RACE > 0:
        tl.store(race_count_ptr + row, listed)
