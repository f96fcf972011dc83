"""Merging the KV splits of paged attention (attention.py): each split leaves an unnormalised partial output and
its log2-domain maximum and sum per row; the merge weighs them by their maxima.

Two ways, the same arithmetic:
- in the attention kernel (the default where the caller passes split tickets): every split program takes a
  ticket of its (query tile, KV head) after storing its partials, and the program that takes the last one merges
  the tile's rows and puts the ticket back to zero, so the next launch finds it zeroed. Decode at batch 8 on the
  H200 spent about 6 us a layer on the separate kernel's launch and ramp (session 17's timeline, perf.md);
- a second kernel, one program per (token, head): callers without tickets (tests, benches that build their own
  metadata), or AttentionTuning(merge_in_kernel=False).

The ticket is the CUDA threadFenceReduction pattern: a CTA barrier after the partial stores, then one acq_rel
atomic at GPU scope, so the last program's loads see every other program's stores.
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
def _merge_split_rows(partial_ptr, max_ptr, sum_ptr, out_ptr, stat_rows, out_offs, rows_valid, dims, dim_valid,
                      NUM_SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the NUM_SPLITS partials of BLOCK_R rows ([R] stat_rows = token * Hq + head) into out. Loads bypass
    L1 (.cg): other SMs wrote the partials."""
    stat = stat_rows * NUM_SPLITS
    splits = tl.arange(0, NUM_SPLITS)
    maxes = tl.load(max_ptr + stat[:, None] + splits[None, :], mask=rows_valid[:, None], other=NO_TILES,
                    cache_modifier=".cg")
    top = tl.max(maxes, axis=1)
    sums = tl.load(sum_ptr + stat[:, None] + splits[None, :], mask=rows_valid[:, None], other=0.0,
                   cache_modifier=".cg")
    total = tl.where(rows_valid, tl.sum(tl.exp2(maxes - top[:, None]) * sums, axis=1), 1.0)  # 1: no 0 / 0
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for split in range(NUM_SPLITS):
        m = tl.load(max_ptr + stat + split, mask=rows_valid, other=NO_TILES, cache_modifier=".cg")
        worked = rows_valid & (m > NO_TILES)  # a split without KV tiles wrote no partial (its weight is 0)
        partial = tl.load(partial_ptr + (stat + split)[:, None] * BLOCK_D + dims[None, :],
                          mask=worked[:, None] & dim_valid[None, :], other=0.0, cache_modifier=".cg")
        acc += partial * tl.exp2(m - top)[:, None]
    out = acc / total[:, None]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=rows_valid[:, None] & dim_valid[None, :])


@triton.jit
def _took_last_ticket(ticket_ptr, NUM_SPLITS: tl.constexpr):
    """After this program's partial stores: whether it is its tile's last split (then it merges). The last one
    zeroes the ticket for the next launch."""
    tl.debug_barrier()  # every thread's stores come before the release below
    last = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1
    if last:
        tl.store(ticket_ptr, 0)
    return last


@triton.jit
def _merge_splits_kernel(partial_ptr, max_ptr, sum_ptr, out_ptr, query_start_loc_ptr, num_seqs,
                         stride_ot, stride_oh, head_dim,
                         NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    num_tokens = tl.load(query_start_loc_ptr + num_seqs)  # a step input: before the wait (pdl.py)
    pdl_wait(USE_PDL)
    if token >= num_tokens:
        return  # padding token: its partials were never written
    one = tl.arange(0, 1)
    dims = tl.arange(0, BLOCK_D)
    stat_rows = token.to(tl.int64) * tl.num_programs(1) + head + one
    out_offs = (token.to(tl.int64) * stride_ot + head * stride_oh + one)[:, None] + dims[None, :]
    _merge_split_rows(partial_ptr, max_ptr, sum_ptr, out_ptr, stat_rows, out_offs, one == 0, dims,
                      dims < head_dim, NUM_SPLITS, 1, BLOCK_D)


def merge_splits(partial: torch.Tensor, maxes: torch.Tensor, sums: torch.Tensor, out: torch.Tensor,
                 query_start_loc: torch.Tensor, num_seqs: int, use_pdl: bool) -> None:
    """The separate merge: partial [T, Hq, splits, BLOCK_D], maxes / sums [T, Hq, splits] -> out [T, Hq, D]."""
    num_tokens, num_q_heads, num_splits, block_d = partial.shape
    _merge_splits_kernel[(num_tokens, num_q_heads)](
        partial, maxes, sums, out, query_start_loc, num_seqs, out.stride(0), out.stride(1), out.shape[2],
        NUM_SPLITS=num_splits, BLOCK_D=block_d, USE_PDL=use_pdl, launch_pdl=use_pdl,
    )
