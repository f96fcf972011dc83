"""qkv's decode GEMV with RoPE and the KV write in its epilogue: one kernel where a layer ran two (issue 17's
"fewer kernel boundaries"; session 25's timeline put rope + KV write at 2.6-2.9 us a layer at batch 8, and every
small kernel at batch 8 carries a few us of ramp and tail beside it).

The GEMV is gemv_rows.py's weight loop for 2..64 rows (tensor cores, the norm prologues in one pass) and gemv.py's
CUDA-core loop for one row (its default tiles: 4 columns, so 2 pairs a program at qkv's shape). What
changes is which W rows a program streams: RoPE (rotate_half) pairs dimension d of a head with d + head_dim/2,
so a program owns BLOCK_N/2 pairs of one head (columns j0..j0+n/2 and the same run half a head further) instead of
BLOCK_N consecutive columns. Every W row is still read once; the weights are not permuted. The epilogue then has
both halves of each pair in registers: it rounds the products to x's dtype (as the unfused GEMV's output is),
rotates q and k heads in fp32 and rounds once (rope.py's rounding), stores q, k and v to the qkv output as the
unfused path leaves them, and writes k and v into the paged cache at each row's slot (-1: no write). V heads take
the same column map and no rotation. Not for Qwen3's per-head q/k norm (a whole head a program): rope.py keeps it.

Its reference is the composition it replaces: gemv.gemv_ref, then rope.rope_and_write_kv_ref.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.gemv import GemvConfig, gemv_ref, one_row_loop
from blink.kernels.gemv_rows import PROLOGUES, TILE_M, _weight_loop
from blink.kernels.pdl import gemv_rows_pdl_for, pdl_for, pdl_wait
from blink.kernels.rope import rope_and_write_kv_ref


@triton.jit
def _pair_columns(pid, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """A program's head, first pair and columns: BLOCK_N / 2 dimensions d of one head, then the same d + HEAD_DIM/2."""
    HALF: tl.constexpr = BLOCK_N // 2
    head = pid // (HEAD_DIM // BLOCK_N)  # HEAD_DIM / BLOCK_N programs a head
    j0 = (pid % (HEAD_DIM // BLOCK_N)) * HALF
    lane = tl.arange(0, BLOCK_N)
    dims = j0 + lane % HALF + (lane // HALF) * (HEAD_DIM // 2)
    return head, j0, dims, head * HEAD_DIM + dims


@triton.jit
def _rope_kv_epilogue(out, head, j0, dims, cols, col_mask, rows, row_mask, out_ptr, stride_om, positions_ptr,
                      cos_sin_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, max_pos, block_size, stride_cb, stride_co,
                      stride_ch, dtype: tl.constexpr, HEAD_DIM: tl.constexpr, Q_HEADS: tl.constexpr,
                      KV_HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out [BLOCK_M, BLOCK_N] fp32 (the GEMV's output, already rounded to x's dtype): q and k heads rotated and
    rounded as rope.py does, stored to qkv; k and v heads also into the paged cache at each row's slot."""
    HALF: tl.constexpr = BLOCK_N // 2
    if head < Q_HEADS + KV_HEADS:  # q and k heads rotate (one branch a program)
        pos = tl.load(positions_ptr + rows, mask=row_mask, other=0)
        pos = tl.minimum(tl.maximum(pos, 0), max_pos - 1).to(tl.int64)
        pair = j0 + tl.arange(0, HALF)
        table = cos_sin_ptr + pos[:, None] * HEAD_DIM + pair[None, :]
        cos = tl.load(table, mask=row_mask[:, None], other=0.0)
        sin = tl.load(table + HEAD_DIM // 2, mask=row_mask[:, None], other=0.0)
        x1, x2 = tl.split(tl.permute(tl.reshape(out, [BLOCK_M, 2, HALF]), (0, 2, 1)))
        rotated = tl.join((x1 * cos - x2 * sin).to(dtype), (x2 * cos + x1 * sin).to(dtype))
        out = tl.reshape(tl.permute(rotated, (0, 2, 1)), [BLOCK_M, BLOCK_N]).to(tl.float32)
    mask = row_mask[:, None] & col_mask[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)
    if head >= Q_HEADS:  # k and v heads: into the paged cache at each row's slot
        slot = tl.load(slots_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
        is_k = head < Q_HEADS + KV_HEADS
        is_v = head >= Q_HEADS + KV_HEADS
        kv_head = tl.where(is_k, head - Q_HEADS, head - Q_HEADS - KV_HEADS)
        offs = ((slot // block_size) * stride_cb + (slot % block_size) * stride_co)[:, None] \
            + kv_head * stride_ch + dims[None, :]
        write = mask & (slot >= 0)[:, None]
        tl.store(k_cache_ptr + offs, out.to(k_cache_ptr.dtype.element_ty), mask=write & is_k)
        tl.store(v_cache_ptr + offs, out.to(v_cache_ptr.dtype.element_ty), mask=write & is_v)


@triton.jit
def _gemv_rope_kv_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, bias_ptr, out_ptr, new_r_ptr, positions_ptr, cos_sin_ptr, slots_ptr,
    k_cache_ptr, v_cache_ptr,
    M, N, K, stride_xm, stride_rm, stride_wn, stride_om, eps, max_pos, block_size, stride_cb, stride_co, stride_ch,
    PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr, HEAD_DIM: tl.constexpr,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """2..64 rows: gemv_rows' weight loop on tensor cores."""
    pid = tl.program_id(0)
    head, j0, dims, cols = _pair_columns(pid, HEAD_DIM, BLOCK_N)
    col_mask = cols < N
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    pdl_wait(USE_PDL)  # everything below may read the previous kernel's output
    # the unfused GEMV's output (rounded to x's dtype), which rope.py would then read
    out, _ = _weight_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, bias_ptr, w_rows, w_rows, cols, col_mask, M, N, K,
                          stride_xm, stride_rm, eps, pid == 0, PROLOGUE, False, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K)
    _rope_kv_epilogue(out, head, j0, dims, cols, col_mask, rows, row_mask, out_ptr, stride_om, positions_ptr,
                      cos_sin_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, max_pos, block_size, stride_cb, stride_co,
                      stride_ch, x_ptr.dtype.element_ty, HEAD_DIM, Q_HEADS, KV_HEADS, BLOCK_M, BLOCK_N)


@triton.jit
def _gemv_rope_kv_one_row_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, bias_ptr, out_ptr, new_r_ptr, positions_ptr, cos_sin_ptr, slots_ptr,
    k_cache_ptr, v_cache_ptr,
    M, N, K, stride_xm, stride_rm, stride_wn, stride_om, eps, max_pos, block_size, stride_cb, stride_co, stride_ch,
    PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr, HEAD_DIM: tl.constexpr,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM_K: tl.constexpr, PREFETCH: tl.constexpr,
):
    """One row: gemv.py's CUDA-core loop (its first W tile loaded before the PDL wait, as there)."""
    pid = tl.program_id(0)
    head, j0, dims, cols = _pair_columns(pid, HEAD_DIM, BLOCK_N)
    col_mask = cols < N
    rows = tl.arange(0, 1)
    ks = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    w_first = tl.load(w_rows + ks[None, :], mask=col_mask[:, None] & (ks < K)[None, :], other=0.0)
    pdl_wait(USE_PDL)  # everything below may read the previous kernel's output
    acc = one_row_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, w_rows, w_first, col_mask, M, K, stride_xm, stride_rm, eps,
                       pid == 0, PROLOGUE, 1, BLOCK_N, BLOCK_K, NORM_K, PREFETCH)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(x_ptr.dtype.element_ty).to(tl.float32)  # the unfused GEMV's rounding
    _rope_kv_epilogue(out, head, j0, dims, cols, col_mask, rows, rows < M, out_ptr, stride_om, positions_ptr,
                      cos_sin_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, max_pos, block_size, stride_cb, stride_co,
                      stride_ch, x_ptr.dtype.element_ty, HEAD_DIM, Q_HEADS, KV_HEADS, 1, BLOCK_N)


def supports(x: torch.Tensor, weight: torch.Tensor, head_dim: int, config: GemvConfig) -> bool:
    """Shapes the kernel takes: head-aligned q|k|v columns and a tile that divides a head evenly; one row on the
    CUDA-core loop (2+ pairs a program), 2..64 rows on tensor cores."""
    rows = x.shape[0]
    kernel = (rows == 1 and not config.dot and config.block_n >= 4) or (
        1 < rows <= 4 * TILE_M and config.dot and config.block_n >= 16)
    return kernel and weight.shape[0] % head_dim == 0 and head_dim % config.block_n == 0


def gemv_rope_kv_ref(x, weight, bias, prologue, norm_weight, eps, residual, positions, cos_sin, k_cache, v_cache,
                     slot_mapping, num_q_heads: int, num_kv_heads: int):
    """gemv_ref, then RoPE on q and k and the KV write (rope_and_write_kv_ref): (qkv, new residual or None)."""
    got = gemv_ref(x, weight, bias, prologue, norm_weight, eps, residual)
    qkv, new_residual = got if prologue == "add_norm" else (got, None)
    head_dim = cos_sin.shape[1]
    q, k, v = (t.view(x.shape[0], -1, head_dim) for t in qkv.split(
        [num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1))
    rope_and_write_kv_ref(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)
    return qkv, new_residual


def gemv_rope_kv_triton(x, weight, bias, prologue, norm_weight, eps, residual, positions, cos_sin, k_cache,
                        v_cache, slot_mapping, num_q_heads: int, num_kv_heads: int, config: GemvConfig):
    """The fused launch: (qkv [M, (Hq + 2 Hkv) D] with q and k rotated, new residual or None); k and v land in the
    caches [blocks, block_size, Hkv, D] at slot_mapping's slots."""
    head_dim = cos_sin.shape[1]
    assert supports(x, weight, head_dim, config), "shape or tiles not taken by the fused qkv GEMV"
    assert weight.shape[0] == (num_q_heads + 2 * num_kv_heads) * head_dim
    m, (n, k) = x.shape[0], weight.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    new_residual = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else None
    grid = (n // config.block_n,)
    args = (x, residual if residual is not None else x, norm_weight if norm_weight is not None else weight, weight,
            bias if bias is not None else weight, out, new_residual if new_residual is not None else out,
            positions, cos_sin, slot_mapping, k_cache, v_cache,
            m, n, k, x.stride(0), residual.stride(0) if residual is not None else 0, weight.stride(0), out.stride(0),
            eps, cos_sin.shape[0], k_cache.shape[1], k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    common = dict(PROLOGUE=PROLOGUES[prologue], HAS_BIAS=bias is not None, HEAD_DIM=head_dim, Q_HEADS=num_q_heads,
                  KV_HEADS=num_kv_heads, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
                  num_stages=config.num_stages)
    if m == 1:  # PDL as the one-row GEMV it replaces takes it
        use_pdl = pdl_for(x)
        _gemv_rope_kv_one_row_kernel[grid](*args, USE_PDL=use_pdl, NORM_K=min(triton.next_power_of_2(k),
                                                                              max(config.block_k, 4096)),
                                           PREFETCH=config.num_stages == 1, launch_pdl=use_pdl, **common)
    else:
        use_pdl = gemv_rows_pdl_for(x)  # gemv_rows' switch: off by default (pdl.py says why)
        _gemv_rope_kv_kernel[grid](*args, USE_PDL=use_pdl, BLOCK_M=max(TILE_M, triton.next_power_of_2(m)),
                                   launch_pdl=use_pdl, **common)
    return out, new_residual
