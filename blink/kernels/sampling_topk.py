"""The top-K logprobs of a row (ties: lower id first) from candidates that many programs gather.

The penalties kernel certifies, per chunk, a key that K of its tokens reach (the K-th largest of its
lanes' maxima: K lanes, K distinct tokens); the largest certificate of a row is a floor at most its K-th
largest token. The compaction kernel (sampling_bucket) copies every token at or above the floor (key and
id) into a per-row candidate list, spread over the row's chunks; the finish kernel sorts them by (value desc, id
asc) and keeps K. A row with more candidates than fit runs sampling_select's one-program search from the
same floor instead (exact too, slower).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_select import canonical, key_value, sortable_key, write_top_logprobs

_INT32_MIN = tl.constexpr(-0x7FFFFFFF - 1)
_INT32_MAX = tl.constexpr(0x7FFFFFFF)


@triton.jit
def asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
    slot = tl.load(slots_ptr + row)
    return (slot >= 0) & (tl.load(num_logprobs_ptr + tl.maximum(slot, 0)) > 0)


@triton.jit
def chunk_certificate(largest, K: tl.constexpr, BLOCK: tl.constexpr):
    """A key that K tokens of the chunk reach: the K-th largest lane maximum (lanes hold distinct tokens)."""
    if K <= BLOCK:
        ordered = tl.sort(largest, 0, descending=True)
        return tl.max(tl.where(tl.arange(0, BLOCK) == K - 1, ordered, _INT32_MIN), 0)
    else:
        return tl.full([], _INT32_MIN, tl.int32)


@triton.jit
def top_floor(part_kth_ptr, part_smallest_ptr, row, P: tl.constexpr, P_PAD: tl.constexpr):
    """A key of the row at most its K-th largest: the best certificate, or the row's smallest key."""
    c = tl.arange(0, P_PAD)
    certified = tl.max(tl.load(part_kth_ptr + row * P + c, mask=c < P, other=_INT32_MIN), 0)
    smallest = tl.min(tl.load(part_smallest_ptr + row * P + c, mask=c < P, other=_INT32_MAX), 0)
    return tl.maximum(certified, smallest)


@triton.jit
def compact_top_chunk(logits_ptr, row, chunk, part_kth_ptr, part_smallest_ptr, counter_ptr, cand_key_ptr, cand_id_ptr,
                      vocab_size: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr, CAND: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Copy this chunk's tokens at or above the row's floor (key and id) into the row's candidate list."""
    floor = top_floor(part_kth_ptr, part_smallest_ptr, row, P, P_PAD)
    raw_row = logits_ptr + row.to(tl.int64) * vocab_size
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        key = sortable_key(canonical(tl.load(raw_row + offs, mask=offs < vocab_size, other=float("-inf"))))
        taken = (offs < vocab_size) & (key >= floor)
        num_taken = tl.sum(taken.to(tl.int32), 0)
        if num_taken > 0:
            base = tl.atomic_add(counter_ptr + row * 2 + 1, num_taken)
            slot = base + tl.cumsum(taken.to(tl.int32), 0) - 1
            tl.store(cand_key_ptr + row * CAND + slot, key, mask=taken & (slot < CAND))
            tl.store(cand_id_ptr + row * CAND + slot, offs, mask=taken & (slot < CAND))


@triton.jit
def _write_sorted_candidates(cand_key_row, cand_id_row, count, normalizer, ids_out, logprobs_out,
                             vocab_size: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr, SIZE: tl.constexpr):
    i = tl.arange(0, SIZE)
    key = tl.load(cand_key_row + i, mask=i < count, other=0)
    ids = tl.load(cand_id_row + i, mask=i < count, other=0)
    # One non-negative int64 per candidate: value descending, then id ascending.
    order = (key.to(tl.int64) + 2147483647 + 1) * vocab_size + (vocab_size - 1 - ids)
    order = tl.sort(tl.where(i < count, order, -1), 0, descending=True)
    tl.debug_barrier()  # every candidate is read before the sorted ones overwrite them
    tl.store(cand_key_row + i, (order // vocab_size - 2147483648).to(tl.int32), mask=i < count)
    tl.store(cand_id_row + i, (vocab_size - 1 - order % vocab_size).to(tl.int32), mask=i < count)
    tl.debug_barrier()  # the sorted candidates land before the first K are read back
    k = tl.arange(0, K_PAD)
    top_ids = tl.load(cand_id_row + k, mask=k < K, other=0)
    values = key_value(tl.load(cand_key_row + k, mask=k < K, other=0))
    tl.store(ids_out + k, top_ids.to(tl.int64), mask=k < K)
    tl.store(logprobs_out + k, values - normalizer, mask=k < K)


@triton.jit
def write_top_from_candidates(raw_row, scratch_row, cand_key_row, cand_id_row, count, floor, largest, normalizer,
                              ids_out, logprobs_out, vocab_size: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
                              CAND: tl.constexpr, SMALL: tl.constexpr, BLOCK: tl.constexpr):
    """The K largest tokens of a row, as ids and x - normalizer, descending (one program per row)."""
    if count <= SMALL:  # the usual case: a short sort
        _write_sorted_candidates(cand_key_row, cand_id_row, count, normalizer, ids_out, logprobs_out, vocab_size, K,
                                 K_PAD, SMALL)
    elif count <= CAND:
        _write_sorted_candidates(cand_key_row, cand_id_row, count, normalizer, ids_out, logprobs_out, vocab_size, K,
                                 K_PAD, CAND)
    else:
        write_top_logprobs(raw_row, scratch_row, floor, largest, normalizer, ids_out, logprobs_out, vocab_size, K,
                           K_PAD, BLOCK)
