"""Keep thresholds (min_p / top_k / top_p) spread over many programs per row: bucket, compact, resolve.

sampling_select's bisection runs one program per row and re-reads a 512 KB row several times from one
SM. Here the row is split in chunks (the penalties kernel's grid, which also wrote each chunk's maximum):
  1. _bucket_kernel: every token kept by min_p falls in a bucket by its distance d = s_max - x / T (a
     monotone function of x: bucket j holds d in [j, j+1) / 128, the last bucket everything beyond); a
     per-row histogram of counts (atomics), and per chunk the exact top_p weight total and the smallest
     kept key.
  2. _compact_kernel: every program plans the same bucket range [j_lo, j_hi] that must hold the threshold
     (top_k: exact counts; top_p: lower/upper bounds of each bucket's weight, so the range is sound) and
     copies the kept tokens of that range into a per-row candidate list; the exact weight of the kept
     tokens above j_lo goes to one per-row sum (int64, so order does not matter).
  3. _resolve_kernel: one program per row sorts the candidates and applies sampling_ref's definition to
     them, offset by the exact count and weight above them: the same threshold, ties included.
A row whose candidates do not fit (or whose maximum is not finite) runs sampling_select's search instead:
still exact, only slower. Scratch: hist [S, NB] i32 and sums [S] i64 (zeroed by the penalties kernel),
part_max / part_min [S, P] i32, part_total [S, P] i64, candidates [S, CAND] i32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_select import canonical, key_value, search_threshold, sortable_key
from blink.kernels.sampling_topk import asks_for_logprobs, compact_top_chunk

# Buckets over d in [0, 32): NB / 32 per unit, a power of two, so d * NB / 32 is exact. Any such NB gives the
# same thresholds; it trades the histogram's cost (per token, linear in NB) against candidates per bucket.
NUM_BUCKETS = 4096
_INT32_MIN = tl.constexpr(-0x7FFFFFFF - 1)
_INT32_MAX = tl.constexpr(0x7FFFFFFF)
_KEY_INF = tl.constexpr(0x7F800000)  # sortable_key(+inf)
_KEY_MINUS_INF = tl.constexpr(-0x7F800001)  # sortable_key(-inf)


@triton.jit
def is_filtered(slot, temperature, top_k, top_p, min_p):
    return (temperature != 0.0) & (slot >= 0) & ((top_k > 0) | (top_p < 1.0) | (min_p > 0.0))


@triton.jit
def top_p_weight(x, inv_temperature, s_max):
    """sampling_ref's fixed-point weight, floor(exp(s - s_max) * 2^32), exact as an integer."""
    return (tl.exp(x * inv_temperature - s_max) * 4294967296.0).to(tl.int64)


@triton.jit
def bucket_of(x, inv_temperature, s_max, NB: tl.constexpr):
    scaled = (s_max - x * inv_temperature) * (NB / 32.0)  # >= 0; NaN (all -inf) and far tokens go to the last bucket
    return tl.where(scaled < NB - 1, scaled, NB - 1).to(tl.int32)


@triton.jit
def row_params(row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr):
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    top_k = tl.load(top_k_ptr + safe_slot)
    top_p = tl.load(top_p_ptr + safe_slot)
    min_p = tl.load(min_p_ptr + safe_slot)
    processed = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0) != 0
    return is_filtered(slot, temperature, top_k, top_p, min_p), processed, temperature, top_k, top_p, min_p


@triton.jit
def row_max(key_max_ptr, row, P: tl.constexpr, P_PAD: tl.constexpr):
    c = tl.arange(0, P_PAD)
    return tl.max(tl.load(key_max_ptr + row * P + c, mask=c < P, other=_INT32_MIN), 0)


@triton.jit
def _plan(hist_row, part_total_row, top_k, top_p, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """The bucket range [j_lo, j_hi] that holds the threshold, the kept tokens above and inside it, and
    the top_p budget. Every program of a row computes the same plan from the same histogram."""
    j = tl.arange(0, NB)
    counts = tl.load(hist_row + j)
    cumulative = tl.cumsum(counts, 0)
    num_kept = tl.sum(counts, 0)
    top_k_active = (top_k > 0) & (top_k < num_kept)
    j_k = tl.sum((cumulative < top_k).to(tl.int32), 0)  # the first bucket that reaches k tokens
    c = tl.arange(0, P_PAD)
    total = tl.sum(tl.load(part_total_row + c, mask=c < P, other=0), 0)
    budget = top_p.to(tl.float64) * total.to(tl.float64)
    # Each bucket's weight per token lies in [w_min, w_max] (1e-5: exp's error in f32, with room to spare).
    jf = j.to(tl.float64)
    w_min = tl.where(j < NB - 1, tl.exp(-(jf + 1.0) / (NB / 32.0)) * 4294967296.0 * (1.0 - 1e-5) - 1.0, 0.0)
    w_min = tl.maximum(w_min, 0.0)
    w_max_prev = tl.exp(-(jf - 1.0) / (NB / 32.0)) * 4294967296.0 * (1.0 + 1e-5) + 1.0
    counts_prev = tl.load(hist_row + j - 1, mask=j > 0, other=0)
    lower = tl.cumsum(counts.to(tl.float64) * w_min, 0) * (1.0 - 1e-9)  # weight of buckets <= j, at least
    upper_before = tl.cumsum(counts_prev.to(tl.float64) * w_max_prev, 0) * (1.0 + 1e-9)  # buckets < j, at most
    # top_p: the range from the last bucket with not all of the budget above it to the first with all of it
    # (with top_k too, top_p's total is over the top_k set: take all of it); top_k alone: its k-th token's
    # bucket; min_p alone (or a top_k that keeps everything): no candidates, the smallest kept token.
    p_lo = tl.maximum(tl.sum((upper_before < budget).to(tl.int32), 0) - 1, 0)
    p_hi = tl.minimum(tl.sum((lower < budget).to(tl.int32), 0), NB - 1)
    j_lo = tl.where(top_p < 1.0, tl.where(top_k_active, 0, p_lo), tl.where(top_k_active, j_k, NB))
    j_hi = tl.where(top_k_active, j_k, tl.where(top_p < 1.0, p_hi, -1))
    num_above = tl.sum(tl.where(j < j_lo, counts, 0), 0)
    num_candidates = tl.sum(tl.where((j >= j_lo) & (j <= j_hi), counts, 0), 0)
    return top_k_active, j_lo, j_hi, num_above, num_candidates, total, budget


@triton.jit
def _bucket_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                   key_max_ptr, kept_min_ptr, part_total_ptr, hist_ptr, vocab_size: tl.constexpr,
                   NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr)
    if filtered:
        src = logits_ptr + row.to(tl.int64) * vocab_size
        if processed:  # penalized or biased: the penalties kernel wrote this row
            src = processed_ptr + row.to(tl.int64) * vocab_size
        inv_temperature = tl.math.div_rn(1.0, temperature)  # rounded as torch's '/'
        s_max = key_value(row_max(key_max_ptr, row, P, P_PAD)) * inv_temperature
        cutoff = tl.where(min_p > 0.0, s_max + tl.log(min_p), float("-inf"))  # -inf: keeps all
        hist = tl.zeros([NB], tl.int32)
        total = tl.zeros([BLOCK], tl.int64)
        smallest = tl.full([BLOCK], _INT32_MAX, tl.int32)
        for start in range(0, CHUNK, BLOCK):
            offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
            x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
            kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
            hist += tl.histogram(bucket_of(x, inv_temperature, s_max, NB), NB, mask=kept)
            if top_p < 1.0:
                total += tl.where(kept, top_p_weight(x, inv_temperature, s_max), 0)
            smallest = tl.minimum(smallest, tl.where(kept, sortable_key(x), _INT32_MAX))
        tl.atomic_add(hist_ptr + row * NB + tl.arange(0, NB), hist, mask=hist != 0)
        tl.store(part_total_ptr + row * P + chunk, tl.sum(total, 0))
        tl.store(kept_min_ptr + row * P + chunk, tl.min(smallest, 0))


@triton.jit
def _compact_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                    min_p_ptr, key_max_ptr, part_total_ptr, hist_ptr, sums_ptr, counter_ptr, cand_ptr,
                    num_logprobs_ptr, part_kth_ptr, part_smallest_ptr, cand_key_ptr, cand_id_ptr,
                    vocab_size: tl.constexpr, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                    CAND: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """The threshold's candidates (filtered rows) and, with K > 0, the top-K logprobs' (rows that ask)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr)
    top = row_max(key_max_ptr, row, P, P_PAD)
    finite = (top < _KEY_INF) & (top > _KEY_MINUS_INF)
    if filtered & finite:
        _, j_lo, j_hi, _, num_candidates, _, _ = _plan(hist_ptr + row * NB, part_total_ptr + row * P, top_k, top_p,
                                                       NB, P, P_PAD)
        if num_candidates <= CAND:  # else the resolve kernel searches the whole row
            src = logits_ptr + row.to(tl.int64) * vocab_size
            if processed:  # penalized or biased: the penalties kernel wrote this row
                src = processed_ptr + row.to(tl.int64) * vocab_size
            inv_temperature = tl.math.div_rn(1.0, temperature)
            s_max = key_value(top) * inv_temperature
            cutoff = tl.where(min_p > 0.0, s_max + tl.log(min_p), float("-inf"))  # -inf: keeps all
            # Two passes over the chunk: count, reserve once, then copy (the second read hits L2). An atomic
            # per block inside the loop put its round trip on every iteration's critical path.
            above = tl.zeros([BLOCK], tl.int64)
            num_inside = tl.zeros([BLOCK], tl.int32)
            for start in range(0, CHUNK, BLOCK):
                offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
                kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
                bucket = bucket_of(x, inv_temperature, s_max, NB)
                num_inside += (kept & (bucket >= j_lo) & (bucket <= j_hi)).to(tl.int32)
                if top_p < 1.0:
                    above += tl.where(kept & (bucket < j_lo), top_p_weight(x, inv_temperature, s_max), 0)
            weight_above = tl.sum(above, 0)
            if weight_above != 0:
                tl.atomic_add(sums_ptr + row, weight_above)
            total_inside = tl.sum(num_inside, 0)
            if total_inside > 0:
                base = tl.atomic_add(counter_ptr + row * 2, total_inside)
                for start in range(0, CHUNK, BLOCK):
                    offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                    x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
                    kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
                    bucket = bucket_of(x, inv_temperature, s_max, NB)
                    inside = kept & (bucket >= j_lo) & (bucket <= j_hi)
                    slot = base + tl.cumsum(inside.to(tl.int32), 0) - 1
                    tl.store(cand_ptr + row * CAND + slot, sortable_key(x), mask=inside & (slot < CAND))
                    base += tl.sum(inside.to(tl.int32), 0)
    if K > 0:
        if asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
            compact_top_chunk(logits_ptr, row, chunk, part_kth_ptr, part_smallest_ptr, counter_ptr, cand_key_ptr,
                              cand_id_ptr, vocab_size, P, P_PAD, CAND, CHUNK, BLOCK)


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
def _resolve_kernel(logits_ptr, processed_ptr, scratch_ptr, out_ptr, slots_ptr, flags_ptr, temperature_ptr,
                    top_k_ptr, top_p_ptr, min_p_ptr, key_max_ptr, kept_min_ptr, part_total_ptr, hist_ptr, sums_ptr,
                    cand_ptr, vocab_size: tl.constexpr, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                    CAND: tl.constexpr, SMALL: tl.constexpr, BLOCK: tl.constexpr):
    """out[row] = sampling_ref.keep_thresholds; rows with no filter write -inf."""
    row = tl.program_id(0)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr)
    threshold = tl.full([], float("-inf"), tl.float32)
    if filtered:
        top = row_max(key_max_ptr, row, P, P_PAD)
        finite = (top < _KEY_INF) & (top > _KEY_MINUS_INF)
        top_k_active, j_lo, j_hi, num_above, num_candidates, total, budget = _plan(
            hist_ptr + row * NB, part_total_ptr + row * P, top_k, top_p, NB, P, P_PAD)
        c = tl.arange(0, P_PAD)
        floor = tl.min(tl.load(kept_min_ptr + row * P + c, mask=c < P, other=_INT32_MAX), 0)  # smallest kept
        searched = (finite & (num_candidates <= CAND)).to(tl.int32)
        if searched & (j_lo <= j_hi):
            inv_temperature = tl.math.div_rn(1.0, temperature)
            s_max = key_value(top) * inv_temperature
            cand_row = cand_ptr + row * CAND
            mass_above = tl.load(sums_ptr + row)
            if num_candidates <= SMALL:  # the usual case: a short sort
                floor, searched = _resolve_candidates(cand_row, num_candidates, num_above, mass_above, floor, budget,
                                                      top_k_active, top_k, top_p, inv_temperature, s_max, SMALL)
            else:
                floor, searched = _resolve_candidates(cand_row, num_candidates, num_above, mass_above, floor, budget,
                                                      top_k_active, top_k, top_p, inv_temperature, s_max, CAND)
        threshold = key_value(floor)
        if searched == 0:
            src = logits_ptr + row.to(tl.int64) * vocab_size
            if processed:  # penalized or biased: the penalties kernel wrote this row
                src = processed_ptr + row.to(tl.int64) * vocab_size
            threshold = search_threshold(src, scratch_ptr + row.to(tl.int64) * vocab_size, temperature, top_k, top_p,
                                         min_p, vocab_size, BLOCK)
    tl.store(out_ptr + row, threshold)
