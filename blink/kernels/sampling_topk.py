"""The top-K logprobs of a row (ties: lower id first) from candidates that many programs gather.

The penalties kernel keeps, per chunk, the K-th largest of its lanes' maxima (K lanes, K distinct tokens
reach it) and its TOP_LANES largest; the row's floor is the best of the chunks' K-th values and of the K-th
largest of all chunks' top lanes together (distinct tokens too), so at most the row's K-th largest token.
The pooled value matters with many chunks: at V = 128k and one row (63 chunks) the best chunk's own K-th
value let 814 tokens of a bench row through, the pooled one 20-22 (docs/roadmap.md). The compaction kernel
(sampling_bucket) copies every token at or above the floor (key and id) into a per-row candidate list,
spread over the row's chunks; the finish kernel sorts them by (value desc, id asc) and keeps K. A row with
more candidates than fit runs sampling_select's one-program search from the same floor instead (exact too,
slower).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_plan import COUNTERS
from blink.kernels.sampling_select import canonical, key_value, sortable_key, write_top_logprobs

_INT32_MIN = tl.constexpr(-0x7FFFFFFF - 1)
_INT32_MAX = tl.constexpr(0x7FFFFFFF)
TOP_LANES = 4  # lane maxima per chunk pooled into the row's floor
TOP_WIDTH = TOP_LANES + 1  # int32 keys per chunk in the floor's scratch: the K-th lane maximum, then the top lanes
_TOP_LANES = tl.constexpr(TOP_LANES)
_TOP_WIDTH = tl.constexpr(TOP_WIDTH)


@triton.jit
def asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
    slot = tl.load(slots_ptr + row)
    return (slot >= 0) & (tl.load(num_logprobs_ptr + tl.maximum(slot, 0)) > 0)


@triton.jit
def store_chunk_top(top_keys_ptr, row, chunk, lanes, K: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr):
    """This chunk's K-th largest lane maximum and its TOP_LANES largest (lanes hold distinct tokens; lanes
    past the vocabulary hold _INT32_MIN)."""
    ordered = tl.sort(lanes, 0, descending=True)
    i = tl.arange(0, BLOCK)
    base = top_keys_ptr + (row * P + chunk) * _TOP_WIDTH
    if K <= BLOCK:
        tl.store(base, tl.max(tl.where(i == K - 1, ordered, _INT32_MIN), 0))
    else:
        tl.store(base, tl.full([], _INT32_MIN, tl.int32))
    tl.store(base + 1 + i, ordered, mask=i < _TOP_LANES)


@triton.jit
def pooled_kth(row_keys, k, WIDTH: tl.constexpr, FIRST: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """The k-th largest of the row's chunks' TOP_LANES top lane maxima pooled (word FIRST on of each chunk's WIDTH
    words at row_keys; distinct tokens), or _INT32_MIN when the pool holds fewer than k."""
    i = tl.arange(0, P_PAD * _TOP_LANES)
    pooled = tl.load(row_keys + (i // _TOP_LANES) * WIDTH + FIRST + i % _TOP_LANES, mask=i // _TOP_LANES < P,
                     other=_INT32_MIN)
    ordered = tl.sort(pooled, 0, descending=True)
    return tl.max(tl.where(i == k - 1, ordered, _INT32_MIN), 0)


@triton.jit
def top_floor(top_keys_ptr, part_smallest_ptr, row, K: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """A key of the row at most its K-th largest: the best of the chunks' K-th values and the K-th largest of
    their top lanes pooled, or the row's smallest key."""
    c = tl.arange(0, P_PAD)
    row_keys = top_keys_ptr + row * P * _TOP_WIDTH
    certified = tl.max(tl.load(row_keys + c * _TOP_WIDTH, mask=c < P, other=_INT32_MIN), 0)
    if K <= P_PAD * _TOP_LANES:
        certified = tl.maximum(certified, pooled_kth(row_keys, K, _TOP_WIDTH, 1, P, P_PAD))
    smallest = tl.min(tl.load(part_smallest_ptr + row * P + c, mask=c < P, other=_INT32_MAX), 0)
    return tl.maximum(certified, smallest)


@triton.jit
def copy_at_or_above(src, chunk, floor, counter, key_row, id_row, vocab_size: tl.constexpr, KEYS: tl.constexpr,
                     IDS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Copy this chunk's tokens whose key is at or above `floor`: keys into key_row (the first KEYS slots), ids into
    id_row (the first IDS; 0: none), at slots taken from the int32 at `counter` (a block without any skips the
    atomic)."""
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        key = sortable_key(canonical(tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))))
        taken = (offs < vocab_size) & (key >= floor)
        num_taken = tl.sum(taken.to(tl.int32), 0)
        if num_taken > 0:
            slot = tl.atomic_add(counter, num_taken) + tl.cumsum(taken.to(tl.int32), 0) - 1
            tl.store(key_row + slot, key, mask=taken & (slot < KEYS))
            if IDS > 0:
                tl.store(id_row + slot, offs, mask=taken & (slot < IDS))


@triton.jit
def compact_top_chunk(logits_ptr, row, chunk, top_keys_ptr, part_smallest_ptr, counter_ptr, cand_key_ptr, cand_id_ptr,
                      vocab_size: tl.constexpr, K: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                      CAND: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Copy this chunk's tokens at or above the row's floor (key and id) into the row's candidate list."""
    copy_at_or_above(logits_ptr + row.to(tl.int64) * vocab_size, chunk,
                     top_floor(top_keys_ptr, part_smallest_ptr, row, K, P, P_PAD), counter_ptr + row * COUNTERS + 1,
                     cand_key_ptr + row * CAND, cand_id_ptr + row * CAND, vocab_size, CAND, CAND, CHUNK, BLOCK)


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
