"""The decode GEMV for 2..64 rows on tensor cores: y = epilogue(prologue(x) W^T (+ b)), one pass over W.

Each program owns BLOCK_N rows of W (output columns) for all M rows of x, padded to 16 rows at least,
and walks K in BLOCK_K steps: acc^T = W x^T with W as the A operand, W tiles fed by Triton's pipeliner
(num_stages - 1 tiles in flight through shared memory). The point above one row is the kernels it removes
from a layer at decode batches, not the GEMM itself (cuBLAS streams W about as well):

- norm prologues in one pass. rms_norm(s) * g with s = x (+ residual) is rstd(s) * (s * g), and rstd is one
  scalar per row, so the loop feeds the tensor cores s * g and sums s^2 on the side; the rows are scaled by
  rstd after the loop. There is no pre-pass over x before the weight stream: session 15's kernel read every
  row of x once more before its first W tile and ran at 2x cuBLAS + the norm kernel (perf.md). Rounding
  differs from the unfused norm at the last bit (s * g is rounded to x's dtype, not s * rstd, then * g).
  Program 0 stores s (the new residual).
- SILU_OUT: for gate|up ([2N, K] weight, gate rows then up rows) the program also owns the matching up rows
  and writes silu(gate) * up [M, N], with the rounding points of the separate kernel (gate and up rounded to
  x's dtype first): the SiLU-mul kernel goes and down_proj reads half the bytes.
- the "silu_mul" prologue (x is gate|up [M, 2K]) is kept for a gate|up that is not on this kernel; each
  program recomputes it over all of K, which is why SILU_OUT exists.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.pdl import gemv_rows_pdl_for, pdl_wait

PROLOGUES = {"none": 0, "norm": 1, "add_norm": 2, "silu_mul": 3}
TILE_M = 16  # x is padded to at least one tensor-core tile of rows


@triton.jit
def _x_tile(x_ptr, r_ptr, nw_ptr, new_r_ptr, rows, M, k, k_mask, stride_xm, stride_rm, K, store_sum,
            PROLOGUE: tl.constexpr):
    """prologue(x) over the columns k for every row, in x's dtype (the dot's B operand), and the squares of s
    for the norm (s = x (+ residual) rounded to x's dtype, as rms_norm rounds it), element by element: a sum over
    k here would be a cross-warp reduction and a barrier in every step of the weight stream (on the H200 that
    made llama3-8b's qkv at 8 rows 2-9x slower than cuBLAS, depending on the tiles; perf.md, session 17)."""
    dtype = x_ptr.dtype.element_ty
    mask = (rows < M)[:, None] & k_mask[None, :]
    offs = rows[:, None] * stride_xm + k[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if PROLOGUE == 2:
        r = tl.load(r_ptr + rows[:, None] * stride_rm + k[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        if store_sum:
            tl.store(new_r_ptr + rows[:, None] * K + k[None, :], x, mask=mask)
    squares = tl.zeros(x.shape, dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 2:
        xf = x.to(tl.float32)
        squares = xf * xf
        w = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        x = (xf * w).to(dtype)
    if PROLOGUE == 3:
        gate = x.to(tl.float32)
        up = tl.load(x_ptr + offs + K, mask=mask, other=0.0).to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(dtype)
    return x, squares


@triton.jit
def _weight_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, bias_ptr, w_rows, w_up_rows, cols, col_mask, M, N, K, stride_xm,
                 stride_rm, eps, store_sum, PROLOGUE: tl.constexpr, SILU_OUT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The stream over the program's W rows (w_rows: one pointer per output column `cols`): prologue(x) W^T (+ b)
    for all M rows of x as [BLOCK_M, BLOCK_N], the norm's rstd applied, rounded to x's dtype (as a linear's output
    then cast (.float()) would be: one kernel fewer) and held in fp32; with SILU_OUT the up rows' (N further) too."""
    ks = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # summed over k once, after the loop
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        w_mask = col_mask[:, None] & k_mask[None, :]
        w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0)
        x_t, sq = _x_tile(x_ptr, r_ptr, nw_ptr, new_r_ptr, rows, M, k, k_mask, stride_xm, stride_rm, K, store_sum,
                          PROLOGUE)
        if PROLOGUE == 1 or PROLOGUE == 2:
            squares += sq
        acc = tl.dot(w, tl.trans(x_t), acc, input_precision="ieee")
        if SILU_OUT:
            w_up = tl.load(w_up_rows + k[None, :], mask=w_mask, other=0.0)
            acc_up = tl.dot(w_up, tl.trans(x_t), acc_up, input_precision="ieee")
    if PROLOGUE == 1 or PROLOGUE == 2:
        rstd = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)
        acc = acc * rstd[None, :]
        acc_up = acc_up * rstd[None, :]
    out, up = tl.trans(acc), tl.trans(acc_up)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if SILU_OUT:
            up += tl.load(bias_ptr + N + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    dtype = x_ptr.dtype.element_ty
    return out.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)


@triton.jit
def _gemv_rows_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, bias_ptr, out_ptr, new_r_ptr,
    M, N, K, stride_xm, stride_rm, stride_wn, stride_om, eps,
    PROLOGUE: tl.constexpr, SILU_OUT: tl.constexpr, HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns; with SILU_OUT, gate rows (up: N further)
    col_mask = cols < N
    rows = tl.arange(0, BLOCK_M)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    w_up_rows = w_rows + N.to(tl.int64) * stride_wn
    pdl_wait(USE_PDL)  # everything below may read the previous kernel's output
    out, up = _weight_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, bias_ptr, w_rows, w_up_rows, cols, col_mask, M, N, K,
                           stride_xm, stride_rm, eps, pid == 0, PROLOGUE, SILU_OUT, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K)
    if SILU_OUT:
        out = (out * tl.sigmoid(out) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    out_offs = rows[:, None] * stride_om + cols[None, :]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_mask[None, :])


def gemv_rows_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: str,
                     norm_weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None,
                     block_n: int, block_k: int, num_warps: int, num_stages: int, silu_out: bool = False,
                     out_dtype: torch.dtype | None = None):
    """The launch; gemv.gemv_triton checks the shapes and picks the tiles. Returns (out, new residual or None)."""
    m = x.shape[0]
    n_w, k = weight.shape
    n = n_w // 2 if silu_out else n_w
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    new_residual = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else None
    use_pdl = gemv_rows_pdl_for(x)  # off by default (pdl.py says why)
    _gemv_rows_kernel[(triton.cdiv(n, block_n),)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else weight, weight,
        bias if bias is not None else weight, out, new_residual if new_residual is not None else out,
        m, n, k, x.stride(0), residual.stride(0) if residual is not None else 0, weight.stride(0), out.stride(0),
        eps,
        PROLOGUE=PROLOGUES[prologue], SILU_OUT=silu_out, HAS_BIAS=bias is not None, USE_PDL=use_pdl,
        BLOCK_M=max(TILE_M, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages, launch_pdl=use_pdl,
    )
    return out, new_residual
