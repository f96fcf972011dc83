"""Per-row selection in Triton without a sort: the keep threshold of min_p / top_k / top_p, and top-K.

Each search looks for the smallest element v of a row such that the tokens above it (x > v, among those
>= a floor) weigh less than a bound, with weight 1 (top_k, top-K logprobs) or the fixed-point top_p
weight of sampling_ref.
The predicate is monotone in v, so a bisection finds it; the bounds are snapped to elements after every
pass (lo to the smallest element above mid, hi to the largest at or below it), so the answer is an
element and equals the sort-based definition exactly, ties included. The first passes read the whole
row (512 KB at 128k tokens, from L2); once at most a quarter of the data lies in [lo, hi], those
candidates are gathered into a scratch row and later passes read only them, so a search costs a few
row reads in all.

Elements are compared through int32 keys that order like the floats (after NaN -> -inf, -0.0 -> +0.0).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def canonical(x):
    x = tl.where(x != x, float("-inf"), x)
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def sortable_key(x):
    """int32 ordered like the (canonical) float x."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def key_value(key):
    """The float of a sortable key (the same bit flip undoes itself)."""
    key = key.to(tl.int32)
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _weight(x, inv_temperature, s_max, WEIGHTED: tl.constexpr):
    if WEIGHTED:  # top_p: floor(exp(s - s_max) * 2^32), exact as an integer
        return (tl.exp(x * inv_temperature - s_max) * 4294967296.0).to(tl.int64)
    else:
        return tl.full(x.shape, 1, tl.int64)


@triton.jit
def _midpoint(lo, hi):
    # Halve the value range (about halves the candidates), kept inside [lo, hi) so each pass shrinks it.
    mid = sortable_key(canonical(key_value(lo) * 0.5 + key_value(hi) * 0.5))
    return tl.minimum(tl.maximum(mid, lo), hi - 1)


@triton.jit
def smallest_passing(data, size, scratch, lo, hi, bound, num_candidates, inv_temperature, s_max,
                     vocab_size: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK: tl.constexpr):
    """Smallest element key v in [lo, hi] with sum(weight(x) for lo <= key(x), key(x) > v) < bound.

    data holds the `size` elements searched (the row, or already the candidates in scratch, which
    holds vocab_size floats). lo and hi must be keys of elements, the answer must lie in [lo, hi]
    (hi passes); num_candidates counts the elements in [lo, hi] (more is fine: it only decides when
    to gather).
    Returns (key, weight of the elements above it).
    """
    above = tl.zeros((), tl.int64)  # weight of the elements above hi
    while lo < hi:
        if num_candidates * 4 <= size:  # most of the data lies outside [lo, hi]: gather the rest
            count = tl.zeros((), tl.int32)
            for start in range(0, vocab_size, BLOCK):
                if start < size:  # in place is safe: an element only moves down, after its block is read
                    offs = start + tl.arange(0, BLOCK)
                    x = tl.load(data + offs, mask=offs < size, other=float("-inf"))
                    key = sortable_key(canonical(x))
                    inside = (offs < size) & (key >= lo) & (key <= hi)
                    tl.store(scratch + count + tl.cumsum(inside.to(tl.int32), 0) - 1, x, mask=inside)
                    count += tl.sum(inside.to(tl.int32), 0)
            tl.debug_barrier()  # the gathered candidates must land before this program reads them
            data = scratch
            size = count

        mid = _midpoint(lo, hi)
        mass = tl.zeros([BLOCK], tl.int64)
        num_low = tl.zeros([BLOCK], tl.int32)
        num_high = tl.zeros([BLOCK], tl.int32)
        below_mid = tl.full([BLOCK], lo, tl.int32)
        above_mid = tl.full([BLOCK], hi, tl.int32)
        for start in range(0, vocab_size, BLOCK):
            if start < size:
                offs = start + tl.arange(0, BLOCK)
                x = canonical(tl.load(data + offs, mask=offs < size, other=float("-inf")))
                key = sortable_key(x)
                inside = (offs < size) & (key >= lo) & (key <= hi)
                high = inside & (key > mid)
                low = inside & (key <= mid)
                mass += tl.where(high, _weight(x, inv_temperature, s_max, WEIGHTED), 0)
                num_low += low.to(tl.int32)
                num_high += high.to(tl.int32)
                below_mid = tl.maximum(below_mid, tl.where(low, key, lo))
                above_mid = tl.minimum(above_mid, tl.where(high, key, hi))
        total = above + tl.sum(mass, 0)
        passes = total.to(tl.float64) < bound
        hi = tl.where(passes, tl.max(below_mid, 0), hi)
        above = tl.where(passes, total, above)
        lo = tl.where(passes, lo, tl.min(above_mid, 0))
        num_candidates = tl.where(passes, tl.sum(num_low, 0), tl.sum(num_high, 0))
    return lo, above


@triton.jit
def row_extremes(src, vocab_size: tl.constexpr, BLOCK: tl.constexpr):
    """Keys of the smallest and the largest element of a row."""
    smallest = tl.full([BLOCK], 0x7FFFFFFF, tl.int32)
    largest = tl.full([BLOCK], -0x7FFFFFFF - 1, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        key = sortable_key(canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))))
        smallest = tl.minimum(smallest, tl.where(offs < vocab_size, key, 0x7FFFFFFF))
        largest = tl.maximum(largest, tl.where(offs < vocab_size, key, -0x7FFFFFFF - 1))
    return tl.min(smallest, 0), tl.max(largest, 0)


@triton.jit
def _gather_min_p(src, scratch, cutoff, inv_temperature, vocab_size: tl.constexpr, BLOCK: tl.constexpr):
    """Copy the elements with x * (1 / T) >= cutoff into scratch; the smallest one's key, and their count."""
    smallest = tl.full([BLOCK], 0x7FFFFFFF, tl.int32)
    count = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
        kept = (offs < vocab_size) & (x * inv_temperature >= cutoff)
        smallest = tl.minimum(smallest, tl.where(kept, sortable_key(x), 0x7FFFFFFF))
        tl.store(scratch + count + tl.cumsum(kept.to(tl.int32), 0) - 1, x, mask=kept)
        count += tl.sum(kept.to(tl.int32), 0)
    tl.debug_barrier()  # the gathered elements must land before this program reads them
    return tl.min(smallest, 0), count


@triton.jit
def _gather_kept(src, scratch, floor, inv_temperature, s_max, vocab_size: tl.constexpr, BLOCK: tl.constexpr):
    """Copy the elements >= floor into scratch; their total top_p weight, and how many there are."""
    total = tl.zeros([BLOCK], tl.int64)
    count = tl.zeros((), tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
        kept = (offs < vocab_size) & (sortable_key(x) >= floor)
        total += tl.where(kept, _weight(x, inv_temperature, s_max, True), 0)
        tl.store(scratch + count + tl.cumsum(kept.to(tl.int32), 0) - 1, x, mask=kept)
        count += tl.sum(kept.to(tl.int32), 0)
    tl.debug_barrier()  # the gathered elements must land before this program reads them
    return tl.sum(total, 0), count


@triton.jit
def search_threshold(src, scratch, temperature, top_k, top_p, min_p, vocab_size: tl.constexpr, BLOCK: tl.constexpr):
    """The keep threshold of sampling_ref.keep_thresholds for one filtered row, by one program."""
    inv_temperature = tl.math.div_rn(1.0, temperature)  # rounded as torch's '/'
    floor, top = row_extremes(src, vocab_size, BLOCK)
    s_max = key_value(top) * inv_temperature
    num_kept = tl.full([], vocab_size, tl.int32)
    data = src  # what the top_k search reads: the row, or what min_p kept of it
    if min_p > 0.0:
        floor, num_kept = _gather_min_p(src, scratch, s_max + tl.log(min_p), inv_temperature, vocab_size, BLOCK)
        data = scratch
    if (top_k > 0) & (top_k < num_kept):
        floor, _ = smallest_passing(data, num_kept, scratch, floor, top, top_k.to(tl.float64), num_kept,
                                    inv_temperature, s_max, vocab_size, False, BLOCK)
    if top_p < 1.0:
        tl.debug_barrier()  # the top_k search is done reading scratch before it is rewritten
        total, num_kept = _gather_kept(src, scratch, floor, inv_temperature, s_max, vocab_size, BLOCK)
        floor, _ = smallest_passing(scratch, num_kept, scratch, floor, top,
                                    top_p.to(tl.float64) * total.to(tl.float64), num_kept, inv_temperature,
                                    s_max, vocab_size, True, BLOCK)
    return key_value(floor)


@triton.jit
def keep_threshold_kernel(logits_ptr, processed_ptr, scratch_ptr, out_ptr, slots_ptr, flags_ptr, temperature_ptr,
                          top_k_ptr, top_p_ptr, min_p_ptr, vocab_size: tl.constexpr, BLOCK: tl.constexpr):
    """out[row] = keep threshold of sampling_ref.keep_thresholds; rows with no filter only write -inf.
    One program per row: sampling_bucket's pipeline falls back to it, and the old-sampler bench runs it."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    top_k = tl.load(top_k_ptr + safe_slot)
    top_p = tl.load(top_p_ptr + safe_slot)
    min_p = tl.load(min_p_ptr + safe_slot)
    threshold = tl.full([], float("-inf"), tl.float32)
    if (temperature != 0.0) & (slot >= 0) & ((top_k > 0) | (top_p < 1.0) | (min_p > 0.0)):
        src = logits_ptr + row.to(tl.int64) * vocab_size
        if tl.load(flags_ptr + safe_slot) != 0:  # penalized or biased: sampling.py wrote this row
            src = processed_ptr + row.to(tl.int64) * vocab_size
        threshold = search_threshold(src, scratch_ptr + row.to(tl.int64) * vocab_size, temperature, top_k, top_p,
                                     min_p, vocab_size, BLOCK)
    tl.store(out_ptr + row, threshold)


@triton.jit
def write_top_logprobs(src, scratch, floor, largest, normalizer, ids_out, logprobs_out,
                       vocab_size: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """The K largest elements of a row (ties: lower id first), as ids and x - normalizer, descending.

    floor and largest are keys of elements: the row's largest, and one at most its K-th largest.
    """
    everything = tl.full([], vocab_size, tl.int32)
    kth, num_above = smallest_passing(src, everything, scratch, floor, largest, tl.full([], K, tl.float64),
                                      everything, 1.0, 0.0, vocab_size, False, BLOCK)
    # Gather: all elements above the K-th (fewer than K), then its ties in id order while room is left.
    num_above = num_above.to(tl.int32)
    taken_above = tl.zeros([], tl.int32)
    taken_tied = tl.zeros([], tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        key = sortable_key(canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))))
        above = (offs < vocab_size) & (key > kth)
        tied = (offs < vocab_size) & (key == kth)
        slot_above = taken_above + tl.cumsum(above.to(tl.int32), 0) - 1
        slot_tied = num_above + taken_tied + tl.cumsum(tied.to(tl.int32), 0) - 1
        take = above | (tied & (slot_tied < K))
        tl.store(ids_out + tl.where(above, slot_above, slot_tied), offs.to(tl.int64), mask=take)
        taken_above += tl.sum(above.to(tl.int32), 0)
        taken_tied += tl.sum(tied.to(tl.int32), 0)
    tl.debug_barrier()  # the gathered ids must land before this program reads them back

    # Order them: value descending, then id ascending, as one non-negative int64 per entry.
    k = tl.arange(0, K_PAD)
    ids = tl.load(ids_out + k, mask=k < K, other=0)
    key = sortable_key(canonical(tl.load(src + ids)))
    order = (key.to(tl.int64) + 2147483647 + 1) * vocab_size + (vocab_size - 1 - ids)
    order = tl.sort(tl.where(k < K, order, -1), 0, descending=True)
    ids = vocab_size - 1 - order % vocab_size
    values = canonical(tl.load(src + ids, mask=k < K, other=0.0))
    tl.debug_barrier()  # every id is read before any is overwritten
    tl.store(ids_out + k, ids, mask=k < K)
    tl.store(logprobs_out + k, values - normalizer, mask=k < K)
