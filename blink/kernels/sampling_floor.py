"""top_k rows without the bucket search (issue 17; BLINK_SAMPLER_TOPK=floor, sampling_grid.topk_floor).

A row's k-th largest token is at least the k-th largest of any k distinct tokens' values. The penalties kernel,
which keeps each lane's largest key over its chunk anyway (the chunk maxima), stores each chunk's TOP_LANES largest
lane maxima: distinct tokens. The k-th largest of all chunks' together (the pool) is then a floor under the row's
k-th largest, close to it when the row's top k spread over the chunks (at most TOP_LANES of them a chunk in distinct
lanes: then it is exact). The compaction copies every token at or above the floor (its key, and its id into the
list race's list, sampling_race) and the resolve sorts those few (sampling_resolve._resolve_candidates: the k-th
largest, then top_p over the top_k set, as sampling_ref), so a top_k row skips the bucket and refine kernels and
the compaction's bucket arithmetic. Like the top-K logprobs' floor (sampling_topk), for the processed row.

Rows taken: a filter with top_k, no min_p, top_k below the vocabulary and within the pool (P * TOP_LANES). Their
candidates are at least k; more than CAND (a row of ties) send it to the one-program search, as an unsound plan
does. Scratch: floor_keys [S, P * TOP_LANES] i32; the candidates take the plan's candidate list and its counter.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_plan import COUNTERS
from blink.kernels.sampling_topk import _INT32_MIN, _TOP_LANES, copy_at_or_above, pooled_kth


@triton.jit
def floor_row(top_k, min_p, vocab_size: tl.constexpr, P: tl.constexpr):
    """Whether a filtered row takes the floor (with min_p the kept set is min_p's first: the search keeps it)."""
    return (top_k > 0) & (top_k < vocab_size) & (top_k <= P * _TOP_LANES) & (min_p <= 0.0)


@triton.jit
def store_floor_lanes(floor_keys_ptr, row, chunk, lanes, P: tl.constexpr, BLOCK: tl.constexpr):
    """This chunk's TOP_LANES largest lane maxima (sampling_topk's pool; lanes: one key a lane, _INT32_MIN past the
    vocabulary), each taken once even when lanes tie."""
    i = tl.arange(0, BLOCK)
    for n in tl.static_range(_TOP_LANES):
        top = tl.max(lanes, 0)
        first = tl.min(tl.where(lanes == top, i, BLOCK), 0)
        tl.store(floor_keys_ptr + (row * P + chunk) * _TOP_LANES + n, top)
        lanes = tl.where(i == first, _INT32_MIN, lanes)


@triton.jit
def lane_floor(floor_keys_ptr, row, top_k, P: tl.constexpr, P_PAD: tl.constexpr):
    """The pool's k-th largest key (_INT32_MIN when the pool holds fewer than k tokens: every token is above)."""
    return pooled_kth(floor_keys_ptr + row * P * _TOP_LANES, top_k, _TOP_LANES, 0, P, P_PAD)


@triton.jit
def compact_floor_chunk(src, row, chunk, floor, counter_ptr, cand_row, list_row, vocab_size: tl.constexpr,
                        CAND: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, RACE: tl.constexpr):
    """Copy this chunk's tokens at or above the floor: keys into the candidate list, ids into the race's list, at
    the same slots (the row's candidate counter)."""
    copy_at_or_above(src, chunk, floor, counter_ptr + row * COUNTERS, cand_row, list_row, vocab_size, CAND, RACE,
                     CHUNK, BLOCK)
