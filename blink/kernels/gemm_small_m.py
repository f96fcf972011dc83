"""y = x W^T (+ b) for a few tokens (M <= 16), W [N, K] row-major as nn.Linear stores it.

At decode batch sizes a linear layer is a stream over its weight matrix: the time is the weight bytes over
HBM bandwidth, and the job is to keep enough 16-byte loads in flight on every SM. Each program owns
BLOCK_N output columns (BLOCK_N rows of W) for all M rows of x and walks K in BLOCK_K steps through a
num_stages-deep cp.async pipeline; x (a few KB) stays in L2. BLOCK_N is picked from N alone so that the
grid covers the 132 SMs a few times over; the choice depends on shapes only, so CUDA graphs stay valid.

With silu_mul_input, x is the gate|up projection output [M, 2K] and the kernel computes
silu(gate) * up (rounded to x's dtype, as silu_and_mul does) while loading it: the MLP's activation
kernel disappears into the down projection.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from blink.kernels.activation import silu_and_mul_ref

MAX_M = 16  # tl.dot needs 16 rows; more tokens than this are a real GEMM for cuBLAS
_NUM_SMS_H200 = 132


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


def default_config(n: int, k: int) -> GemmConfig:
    """The widest N tile that still gives >= 2 programs per SM, and about 8 KB of W per pipeline stage
    (rows of >= 128 bytes), so two or three programs fit in one SM's shared memory with 4 stages."""
    block_n = 16
    for candidate in (128, 64, 32):
        if triton.cdiv(n, candidate) >= 2 * _NUM_SMS_H200:
            block_n = candidate
            break
    block_k = min(max(64, 4096 // block_n), triton.next_power_of_2(k))
    return GemmConfig(block_n=block_n, block_k=block_k)


def enabled_by_env() -> bool:
    """BLINK_SMALL_M_GEMM=1 routes the model's linears with M <= 16 here (default: cuBLAS), read when a
    layer is built. Turn it on where bench_step_kernels shows this kernel beating F.linear."""
    return os.environ.get("BLINK_SMALL_M_GEMM", "0") == "1"


def supports(x: torch.Tensor, weight: torch.Tensor, silu_mul_input: bool = False) -> bool:
    """Whether the small-M kernel takes this call (shapes and dtypes only: graph-safe)."""
    k = weight.shape[1]
    return (x.dim() == 2 and x.shape[0] <= MAX_M and x.shape[1] == (2 * k if silu_mul_input else k)
            and x.stride(-1) == 1 and weight.is_contiguous() and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and k % 16 == 0)


def linear_small_m_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       silu_mul_input: bool = False, config: GemmConfig | None = None) -> torch.Tensor:
    if silu_mul_input:
        x = silu_and_mul_ref(x)
    return F.linear(x, weight, bias)


@triton.jit
def _small_m_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    row_valid = rows < M
    col_valid = cols < N
    x_row = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    w_row = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        if EVEN_K:
            x_mask = row_valid[:, None]
            w = tl.load(w_row + k[None, :], mask=col_valid[:, None], other=0.0)
        else:
            x_mask = row_valid[:, None] & (k < K)[None, :]
            w = tl.load(w_row + k[None, :], mask=col_valid[:, None] & (k < K)[None, :], other=0.0)
        x = tl.load(x_row + k[None, :], mask=x_mask, other=0.0)
        if SILU_MUL:  # x holds gate | up; round like silu_and_mul before the product
            up = tl.load(x_row + K + k[None, :], mask=x_mask, other=0.0).to(tl.float32)
            gate = x.to(tl.float32)
            x = (gate * tl.sigmoid(gate) * up).to(w_ptr.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    out_offs = rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & col_valid[None, :])


def linear_small_m_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          silu_mul_input: bool = False, config: GemmConfig | None = None) -> torch.Tensor:
    assert supports(x, weight, silu_mul_input), "shape/dtype not handled by the small-M GEMM"
    m = x.shape[0]
    n, k = weight.shape
    config = config or default_config(n, k)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _small_m_gemm_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, bias if bias is not None else weight, out, m, n, k, x.stride(0), weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul_input, EVEN_K=k % config.block_k == 0,
        BLOCK_M=MAX_M, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
