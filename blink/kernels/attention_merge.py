"""Merging the KV splits of paged attention (attention.py): each split leaves an unnormalised partial output and
its log2-domain maximum and sum per row; the merge weighs them by their maxima.

Two ways, the same arithmetic:
- a second kernel, one program per (token, head) (the default);
- in the attention kernel (AttentionTuning(merge_in_kernel=True) and the caller's split tickets): every split
  program takes a ticket of its (query tile, KV head) after storing its partials, and the program that takes the
  last one merges the tile's rows and puts the ticket back to zero, so the next launch finds it zeroed. Decode at
  batch 8 on the H200 spent about 6 us a layer on the separate kernel's launch and ramp (session 17's timeline).

The ticket is the CUDA threadFenceReduction pattern: a CTA barrier after the partial stores, then one acq_rel
atomic at GPU scope, so the last program's loads see every other program's stores. The H200 ran the first version
(the last split looping over the splits one load each) 7% / 4% slower at batch 1 / 8 than the separate kernel
(perf.md, session 18), so AttentionTuning.merge_in_kernel is off by default; today's version loads a chunk of
splits at once and has not been timed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait

NO_TILES = tl.constexpr(-1.0e30)  # the maximum a split without KV tiles writes; the merge reads no partial there


def split_tickets(max_tiles: int, num_kv_heads: int, device) -> torch.Tensor:
    """Zeroed tickets for launches of up to max_tiles query tiles (a step of T tokens and S sequences has at most
    T + S) over num_kv_heads heads. Owned by the step's runner, outside any graph pool: the kernel leaves them
    zero, so every replay finds them zero. One launch at a time may use them (a stream's kernels run in order)."""
    return torch.zeros(max_tiles * num_kv_heads, dtype=torch.int32, device=device)


@triton.jit
def _took_last_ticket(ticket_ptr, NUM_SPLITS: tl.constexpr):
    """After this program's partial stores: whether it is its tile's last split (then it merges). The last one
    zeroes the ticket for the next launch."""
    tl.debug_barrier()  # every thread's stores come before the release below
    last = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1
    if last:
        tl.store(ticket_ptr, 0)
    return last


MERGE_VALUES = 8192  # fp32 values of one merge load: 64 registers a thread at 4 warps


def merge_chunk(num_splits: int, group: int, block_d: int) -> int:
    """Splits the last split's merge loads at once: [group, chunk, BLOCK_D] fp32 within MERGE_VALUES, so a batch-1
    decode tile (group 4, 16 splits) merges in one round trip to L2, not 16 (the first version's split-by-split loop
    lost 7% of the batch-1 step on the H200, session 18)."""
    group_pad = triton.next_power_of_2(group)
    return max(1, min(num_splits, MERGE_VALUES // (group_pad * block_d)))


@triton.jit
def _merge_tile_if_last(partial_ptr, max_ptr, sum_ptr, out_ptr, ticket_ptr, q_start, q_first, q_len, kv_head,
                        num_q_heads, stride_ot, stride_oh, head_dim, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                        BLOCK_Q: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
                        CHUNK: tl.constexpr):
    """The tile's last split to finish merges the tile's rows (one ticket per (query tile, KV head)): token by
    token, the group's heads x CHUNK splits x BLOCK_D at a time."""
    ticket = ticket_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    if _took_last_ticket(ticket, NUM_SPLITS):
        group = tl.arange(0, GROUP_PAD)
        head_ok = group < GROUP
        heads = kv_head * GROUP + group
        splits, chunk = tl.arange(0, NUM_SPLITS), tl.arange(0, CHUNK)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < head_dim
        for t in range(0, tl.minimum(BLOCK_Q, q_len - q_first)):
            token = (q_start + q_first + t).to(tl.int64)
            stat = (token * num_q_heads + heads) * NUM_SPLITS  # [G]: the row's first split
            maxes = tl.load(max_ptr + stat[:, None] + splits[None, :], mask=head_ok[:, None], other=NO_TILES,
                            cache_modifier=".cg")
            top = tl.max(maxes, axis=1)
            sums = tl.load(sum_ptr + stat[:, None] + splits[None, :], mask=head_ok[:, None], other=0.0,
                           cache_modifier=".cg")
            total = tl.where(head_ok, tl.sum(tl.exp2(maxes - top[:, None]) * sums, axis=1), 1.0)  # 1: no 0 / 0
            acc = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)
            for first in range(0, NUM_SPLITS, CHUNK):
                at = stat[:, None] + first + chunk[None, :]  # [G, C]
                m = tl.load(max_ptr + at, mask=head_ok[:, None], other=NO_TILES, cache_modifier=".cg")
                worked = head_ok[:, None] & (m > NO_TILES)  # a split without KV tiles wrote no partial
                partial = tl.load(partial_ptr + at[:, :, None] * BLOCK_D + dims[None, None, :],
                                  mask=worked[:, :, None] & dim_ok[None, None, :], other=0.0, cache_modifier=".cg")
                acc += tl.sum(partial * tl.exp2(m - top[:, None])[:, :, None], axis=1)
            out_offs = token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
            tl.store(out_ptr + out_offs, (acc / total[:, None]).to(out_ptr.dtype.element_ty),
                     mask=head_ok[:, None] & dim_ok[None, :])


@triton.jit
def _merge_splits_kernel(partial_ptr, max_ptr, sum_ptr, out_ptr, query_start_loc_ptr, num_seqs,
                         stride_ot, stride_oh, head_dim,
                         NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    num_tokens = tl.load(query_start_loc_ptr + num_seqs)  # a step input: before the wait (pdl.py)
    pdl_wait(USE_PDL)
    if token >= num_tokens:
        return  # padding token: its partials were never written
    row = token.to(tl.int64) * tl.num_programs(1) + head
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, BLOCK_D)
    m = tl.load(max_ptr + row * NUM_SPLITS + splits)
    weights = tl.exp2(m - tl.max(m, axis=0))  # maxima are in the log2 domain
    total = tl.sum(weights * tl.load(sum_ptr + row * NUM_SPLITS + splits), axis=0)
    worked = m > NO_TILES  # a split without KV tiles wrote no partial (its weight is 0)
    partial = tl.load(partial_ptr + (row * NUM_SPLITS + splits)[:, None] * BLOCK_D + dims[None, :],
                      mask=worked[:, None], other=0.0)
    out = tl.sum(partial * weights[:, None], axis=0) / total
    out_offs = token.to(tl.int64) * stride_ot + head * stride_oh + dims
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=dims < head_dim)


def merge_splits(partial: torch.Tensor, maxes: torch.Tensor, sums: torch.Tensor, out: torch.Tensor,
                 query_start_loc: torch.Tensor, num_seqs: int, use_pdl: bool) -> None:
    """The separate merge: partial [T, Hq, splits, BLOCK_D], maxes / sums [T, Hq, splits] -> out [T, Hq, D]."""
    num_tokens, num_q_heads, num_splits, block_d = partial.shape
    _merge_splits_kernel[(num_tokens, num_q_heads)](
        partial, maxes, sums, out, query_start_loc, num_seqs, out.stride(0), out.stride(1), out.shape[2],
        NUM_SPLITS=num_splits, BLOCK_D=block_d, USE_PDL=use_pdl, launch_pdl=use_pdl,
    )
