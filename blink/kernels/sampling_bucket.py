"""Keep thresholds (min_p / top_k / top_p) spread over many programs per row: bucket, refine, compact, resolve.

sampling_select's bisection runs one program per row and re-reads a 512 KB row several times from one
SM. Here the row is split in chunks (the penalties kernel's grid, which also wrote each chunk's maximum), and
the threshold is narrowed in two histogram levels (sampling_plan):
  1. _bucket_kernel: every token kept by min_p falls in a coarse bucket by its distance d = s_max - x / T;
     a per-row histogram of counts (atomics), and per chunk the exact top_p weight total and the smallest
     kept key.
  2. _refine_kernel: every program plans the same coarse range [J_lo, J_hi] that must hold the threshold and
     histograms the kept tokens inside it into fine buckets; the exact weight of the kept tokens before J_lo
     goes to one per-row sum (int64, so order does not matter). The row's last program to finish (a ticket)
     plans the fine range [f_lo, f_hi] and stores both plans for the two kernels after it (row_plans).
  3. _compact_kernel (sampling_compact.py): the fine range's tokens are copied into a per-row candidate list,
     and the exact weight of the coarse range's tokens before f_lo goes to a second sum.
  4. _resolve_kernel (sampling_resolve.py): one program per row sorts the candidates and applies
     sampling_ref's definition to them, offset by the exact count and weight before them: the same threshold,
     ties included.
Triton's histogram costs per token in proportion to its bucket count (perf.md, 2026-12-01 session 8: 4,096
buckets were 459 of a 632 us sampler at S = 32), so two small levels replace one fine one; the fine level also
keeps a flat row's candidates few, where one coarse level overflowed them. A row whose candidates still do not
fit (or whose maximum is not finite) runs sampling_select's search instead: still exact, only slower. Scratch:
hist [S, 2 * NB] i32 (coarse, then fine), sums [S, 2] i64 and counters [S, COUNTERS] i32, zeroed by the
penalties kernel; part_max / part_min [S, P] i32, part_total [S, P] i64, row_plans [S, PLAN_WORDS] i64,
candidates [S, CAND] i32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_floor import floor_row
from blink.kernels.sampling_plan import (
    COUNTERS,
    PLAN_WORDS,
    coarse_bucket,
    decided,
    fine_bucket,
    plan_coarse,
    plan_fine,
    refinement,
    scaled_distance,
    store_row_plan,
)
from blink.kernels.sampling_select import canonical, key_value, sortable_key

# Buckets per level over d in [0, 32): NB / 32 per unit, a power of two. Any such NB gives the same
# thresholds; it trades the histograms' cost against candidates per bucket.
NUM_BUCKETS = 128
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
def row_params(row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr,
               REJECT: tl.constexpr):
    """REJECT: the rejection ran first (sampling_reject); a row it decided counts as not filtered."""
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    top_k = tl.load(top_k_ptr + safe_slot)
    top_p = tl.load(top_p_ptr + safe_slot)
    min_p = tl.load(min_p_ptr + safe_slot)
    processed = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0) != 0
    filtered = is_filtered(slot, temperature, top_k, top_p, min_p)
    if REJECT:
        filtered = filtered & ~decided(reject_ptr, row)
    return filtered, processed, temperature, top_k, top_p, min_p


@triton.jit
def row_max(key_max_ptr, row, P: tl.constexpr, P_PAD: tl.constexpr):
    c = tl.arange(0, P_PAD)
    return tl.max(tl.load(key_max_ptr + row * P + c, mask=c < P, other=_INT32_MIN), 0)


@triton.jit
def _row_top(key_max_ptr, row, P: tl.constexpr, P_PAD: tl.constexpr):
    """The row's largest key and whether it is finite (a row of -inf or with +inf/NaN has no bucket plan)."""
    top = row_max(key_max_ptr, row, P, P_PAD)
    return top, (top < _KEY_INF) & (top > _KEY_MINUS_INF)


@triton.jit
def _row_source(logits_ptr, processed_ptr, row, processed, vocab_size: tl.constexpr):
    src = logits_ptr + row.to(tl.int64) * vocab_size
    if processed:  # penalized or biased: the penalties kernel wrote this row
        src = processed_ptr + row.to(tl.int64) * vocab_size
    return src


@triton.jit
def scale_cutoff(temperature, min_p, top):
    """1 / T, the largest scaled logit and min_p's cutoff (-inf: keeps all) under the largest key `top`."""
    inv_temperature = tl.math.div_rn(1.0, temperature)  # rounded as torch's '/'
    s_max = key_value(top) * inv_temperature
    return inv_temperature, s_max, tl.where(min_p > 0.0, s_max + tl.log(min_p), float("-inf"))


@triton.jit
def _row_scale(logits_ptr, processed_ptr, row, processed, temperature, min_p, top, vocab_size: tl.constexpr):
    """The row's source, 1 / T, its largest scaled logit and min_p's cutoff (-inf: keeps all)."""
    src = _row_source(logits_ptr, processed_ptr, row, processed, vocab_size)
    inv_temperature, s_max, cutoff = scale_cutoff(temperature, min_p, top)
    return src, inv_temperature, s_max, cutoff


@triton.jit
def _classify(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r, span, vocab_size: tl.constexpr,
              NB: tl.constexpr):
    """A block's tokens: the value, kept by min_p, coarse bucket, inside the coarse range, fine bucket."""
    x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
    kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
    scaled = scaled_distance(x, inv_temperature, s_max, NB)
    coarse = coarse_bucket(scaled, NB)
    in_range = kept & (coarse >= j_lo) & (coarse <= j_hi)
    return x, kept, coarse, in_range, fine_bucket(scaled, r, j_lo, span)


@triton.jit
def _bucket_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                   reject_ptr, key_max_ptr, kept_min_ptr, part_total_ptr, hist_ptr, chunk_hist_ptr,
                   vocab_size: tl.constexpr, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                   CHUNK_HIST: tl.constexpr = False, REJECT: tl.constexpr = False, FLOOR: tl.constexpr = False,
                   USE_PDL: tl.constexpr = False):
    """CHUNK_HIST: also keep this chunk's coarse histogram, cumulative (sampling_compact's one-read compaction).
    FLOOR: the rows that take the lane floor (sampling_floor) skip it."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, REJECT)
    filtered = filtered & ~(FLOOR & floor_row(top_k, min_p, vocab_size, P))
    if filtered:
        src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed, temperature,
                                                         min_p, row_max(key_max_ptr, row, P, P_PAD), vocab_size)
        hist = tl.zeros([NB], tl.int32)
        total = tl.zeros([BLOCK], tl.int64)
        smallest = tl.full([BLOCK], _INT32_MAX, tl.int32)
        for start in range(0, CHUNK, BLOCK):
            offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
            x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
            kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
            hist += tl.histogram(coarse_bucket(scaled_distance(x, inv_temperature, s_max, NB), NB), NB, mask=kept)
            if top_p < 1.0:
                total += tl.where(kept, top_p_weight(x, inv_temperature, s_max), 0)
            smallest = tl.minimum(smallest, tl.where(kept, sortable_key(x), _INT32_MAX))
        tl.atomic_add(hist_ptr + row * (2 * NB) + tl.arange(0, NB), hist, mask=hist != 0)
        if CHUNK_HIST:
            tl.store(chunk_hist_ptr + (row * P + chunk) * (2 * NB) + tl.arange(0, NB), tl.cumsum(hist, 0))
        tl.store(part_total_ptr + row * P + chunk, tl.sum(total, 0))
        tl.store(kept_min_ptr + row * P + chunk, tl.min(smallest, 0))


@triton.jit
def _refine_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                   reject_ptr, key_max_ptr, part_total_ptr, hist_ptr, sums_ptr, counter_ptr, plan_ptr, chunk_hist_ptr,
                   vocab_size: tl.constexpr, NB: tl.constexpr, LOG2_NB: tl.constexpr, P: tl.constexpr,
                   P_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNK_HIST: tl.constexpr = False,
                   REJECT: tl.constexpr = False, FLOOR: tl.constexpr = False, USE_PDL: tl.constexpr = False):
    """The fine histogram of the coarse range, and the exact weight of the kept tokens before it; the row's last
    program to finish plans the fine level for the kernels after (store_row_plan). CHUNK_HIST: also keep this
    chunk's fine histogram, cumulative (sampling_compact's one-read compaction). FLOOR: as the bucket kernel's."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, REJECT)
    filtered = filtered & ~(FLOOR & floor_row(top_k, min_p, vocab_size, P))
    top, finite = _row_top(key_max_ptr, row, P, P_PAD)
    if filtered & finite:
        hist_row = hist_ptr + row * (2 * NB)
        top_k_active, j_lo, j_hi, num_above, _, num_kept, total, budget = plan_coarse(
            hist_row, part_total_ptr + row * P, top_k, top_p, NB, P, P_PAD)
        span = j_hi - j_lo + 1
        r = refinement(span, NB, LOG2_NB)
        if j_lo <= j_hi:
            src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed, temperature,
                                                             min_p, top, vocab_size)
            fine = tl.zeros([NB], tl.int32)
            before = tl.zeros([BLOCK], tl.int64)
            for start in range(0, CHUNK, BLOCK):
                offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
                x, kept, coarse, inside, sub = _classify(src, offs, inv_temperature, s_max, cutoff, j_lo, j_hi, r,
                                                         span, vocab_size, NB)
                fine += tl.histogram(tl.where(inside, sub, 0), NB, mask=inside)
                if top_p < 1.0:
                    before += tl.where(kept & (coarse < j_lo), top_p_weight(x, inv_temperature, s_max), 0)
            tl.atomic_add(hist_row + NB + tl.arange(0, NB), fine, mask=fine != 0)
            if CHUNK_HIST:
                tl.store(chunk_hist_ptr + (row * P + chunk) * (2 * NB) + NB + tl.arange(0, NB), tl.cumsum(fine, 0))
            weight_before = tl.sum(before, 0)
            if weight_before != 0:
                tl.atomic_add(sums_ptr + row * 2, weight_before)
        # A ticket per row (acq_rel): the program that takes the last one sees every chunk's counts and weight.
        if tl.atomic_add(counter_ptr + row * COUNTERS + 2, 1) == P - 1:
            f_lo = tl.full([], 1, tl.int32)
            f_hi = tl.zeros([], tl.int32)
            num_candidates = tl.zeros([], tl.int32)
            if j_lo <= j_hi:
                _fine_top_k, f_lo, f_hi, num_above, num_candidates = plan_fine(
                    hist_row, j_lo, j_hi, r, num_above, tl.load(sums_ptr + row * 2), total, num_kept, top_k, top_p,
                    budget, NB)
            store_row_plan(plan_ptr + row * PLAN_WORDS, top_k_active, j_lo, j_hi, r, f_lo, f_hi, num_above,
                           num_candidates, total)
