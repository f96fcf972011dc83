"""y = prologue(x) W^T (+ b) for decode-sized M (<= MAX_M rows), W [N, K] row-major as nn.Linear stores it.

At decode batch sizes a linear layer is a stream over its weight: the time is the weight bytes over HBM
bandwidth, and the job is to keep enough 16-byte loads in flight on every SM. Each program owns BLOCK_N
rows of W for all M rows of x and walks K in BLOCK_K steps. x is a few KB and stays in L2 for all programs.
Two kernels, by M (GemvConfig.dot):
    M = 1      this file's CUDA-core loop: the next W tile is loaded before the current one is used (a register
               double buffer); the products stay in a [BLOCK_N, BLOCK_K] fp32 sum reduced over K once.
    M = 2..64  gemv_rows.py on tensor cores, with the norm in one pass and gate|up's SiLU-mul in its epilogue
               (the CUDA-core loop over M rows ran at 0.27x cuBLAS at M = 8 on the H200: perf.md, session 14).

The prologue folds the step's small kernels into the GEMV, with the rounding points of the kernels they
replace (rmsnorm.py, activation.py), so a layer launches fewer kernels:
    "none"      x as is
    "norm"      rms_norm(x) * norm_weight
    "add_norm"  s = x + residual, rms_norm(s) * norm_weight; program 0 stores s (the new residual)
    "silu_mul"  x is gate|up [M, 2K]: silu(gate) * up
At one row a norm needs the row's full sum of squares first: each program reads x once more for it (from
L2). With PDL (pdl.py) the first W tile is loaded before waiting for the previous kernel: weights are never
written during a step. The epilogue "silu_mul" (tensor cores only) takes a gate|up weight [2N, K] and writes
silu(gate) * up [M, N].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from blink.kernels.activation import silu_and_mul_ref
from blink.kernels.gemv_rows import PROLOGUES, TILE_M, gemv_rows_triton
from blink.kernels.pdl import pdl_for, pdl_wait
from blink.kernels.rmsnorm import rms_norm_ref

MAX_M = 4 * TILE_M  # batch 64 (offline's decode); above it a GEMM is no longer a stream over W
_NUM_SMS_H200 = 132
_RESIDENT_PER_SM = 4  # one-row programs of ~114 registers x 128 threads per SM (ptxas, sm_90)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    num_stages: int = 1  # 1: the explicit register double buffer; >1: no explicit buffer, Triton's pipeliner
    #                      keeps num_stages - 1 W tiles in flight (async copies to shared memory)
    dot: bool = False  # tensor cores (gemv_rows.py; needs block_n >= 16): the only kernel for M > 1, a variant at M = 1


@dataclass(frozen=True)
class GemvPlan:
    """What a linear layer decided at load time: take calls of up to max_m rows, with this config (None:
    default_config of the call's shape, which depends on M too). rope_kv (qkv only): RoPE and the
    KV write run in the GEMV's epilogue (gemv_rope.py)."""

    config: GemvConfig | None = None
    max_m: int = MAX_M
    rope_kv: bool = False


def _last_wave_fill(programs: int) -> float:
    slots = _RESIDENT_PER_SM * _NUM_SMS_H200
    return programs / (triton.cdiv(programs, slots) * slots)


def widest_filling(widths: tuple[int, ...], programs_of) -> int:
    """The first width (rows a one-row program) whose programs_of(width) programs fill the last wave to >= 90% (a
    part-empty last wave leaves HBM idle), else the best-filling one."""
    full = [bn for bn in widths if _last_wave_fill(programs_of(bn)) >= 0.9]
    return full[0] if full else max(widths, key=lambda bn: _last_wave_fill(programs_of(bn)))


def default_config(n: int, k: int, m: int = 1, prologue: str = "none", epilogue: str = "none") -> GemvConfig:
    """One row: W tiles of 4096 elements (8 KB in bf16), 4 x 1024 first (one W row per warp, so the reduction
    over K stays inside a warp: 64 registers, ptxas); the first width whose programs fill the last wave to
    >= 90% (a part-empty last wave leaves HBM idle), else the best-filling one. The SiLU-mul prologue is the
    exception: every program computes silu(gate) * up over all of K, a sigmoid per element of x per program,
    so it wants 8 rows per program (llama3-8b's down_proj on the H200: 41.8 us at 4 x 1024, 32.4 at 8 x 512;
    perf.md, 2026-12-02 session 12).

    More rows: the tensor-core kernel (gemv_rows.py) in the tiles that won session 17's sweep on the H200
    (llama3-8b at M = 8 and 32, perf.md): o and down 32 x 512, 3 stages (o at M = 8: 12.1 us against cuBLAS's
    14.0); the LM head 64 x 128, 4 stages (238 against 246 us); a norm prologue 64 x 256, 3 stages (64 rows of W
    a program run on Hopper's warpgroup MMA); gate|up with its SiLU-mul epilogue (two W tiles a step) 64 x 64,
    4 stages (62.4 us against 68.3 for the norm, cuBLAS and SiLU-mul kernels)."""
    if m > 1 or epilogue != "none":
        if epilogue == "silu_mul":
            return GemvConfig(block_n=64, block_k=64, num_stages=4, dot=True)
        if prologue in ("norm", "add_norm"):
            return GemvConfig(block_n=64, block_k=256 if m <= 32 else 128, num_stages=3, dot=True)
        if n >= 32768:
            return GemvConfig(block_n=64, block_k=128 if m <= 16 else 64, num_stages=4, dot=True)
        return GemvConfig(block_n=32, block_k=512 if m <= 32 else 256, num_stages=3, dot=True)
    widths = (8, 16) if prologue == "silu_mul" else (4, 8, 2)
    block_n = widest_filling(widths, lambda bn: triton.cdiv(n, bn))
    return GemvConfig(block_n=block_n, block_k=max(16, min(4096 // block_n, triton.next_power_of_2(k))))


def supports(x: torch.Tensor, weight: torch.Tensor, prologue: str = "none", epilogue: str = "none") -> bool:
    """Whether the GEMV takes this call (shapes and dtypes only, so graph-safe). The SiLU-mul epilogue needs a
    gate|up weight (an even number of rows) and runs on tensor cores."""
    k = weight.shape[1]
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_M and x.shape[1] == (2 * k if prologue == "silu_mul" else k)
            and x.stride(-1) == 1 and weight.is_contiguous() and x.dtype == weight.dtype and k % 8 == 0
            and (epilogue == "none" or (epilogue == "silu_mul" and weight.shape[0] % 2 == 0
                                        and prologue != "silu_mul")))


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, prologue: str = "none",
             norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
             config: GemvConfig | None = None, out_dtype: torch.dtype | None = None, epilogue: str = "none"):
    """The composition of the kernels the prologue and epilogue replace; returns (out, new residual) for
    add_norm."""
    new_residual = None
    if prologue == "norm":
        x = rms_norm_ref(x, norm_weight, eps)
    elif prologue == "add_norm":
        x, new_residual = rms_norm_ref(x, norm_weight, eps, residual)
    elif prologue == "silu_mul":
        x = silu_and_mul_ref(x)
    out = F.linear(x, weight, bias)
    if epilogue == "silu_mul":
        out = silu_and_mul_ref(out)
    out = out.to(out_dtype or x.dtype)
    return (out, new_residual) if prologue == "add_norm" else out


@triton.jit
def _x_row(x_ptr, r_ptr, nw_ptr, m, M, k, k_mask, stride_xm, stride_rm, rstd_m, K,
           PROLOGUE: tl.constexpr):
    """Row m of prologue(x) over the columns k, in fp32 (zero where masked)."""
    dtype = x_ptr.dtype.element_ty
    mask = k_mask & (m < M)
    x = tl.load(x_ptr + m * stride_xm + k, mask=mask, other=0.0)
    if PROLOGUE == 2:
        x = (x.to(tl.float32) + tl.load(r_ptr + m * stride_rm + k, mask=mask, other=0.0).to(tl.float32)).to(dtype)
    if PROLOGUE == 1 or PROLOGUE == 2:
        w = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        x = ((x.to(tl.float32) * rstd_m).to(dtype).to(tl.float32) * w).to(dtype)
    if PROLOGUE == 3:
        gate = x.to(tl.float32)
        up = tl.load(x_ptr + m * stride_xm + K + k, mask=mask, other=0.0).to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(dtype)
    return x.to(tl.float32)


@triton.jit
def one_row_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, w_rows, w_first, col_mask, M, K, stride_xm, stride_rm, eps,
                 store_residual, PROLOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, NORM_K: tl.constexpr, PREFETCH: tl.constexpr):
    """After the PDL wait: the row's prologue and the stream over this program's W rows (w_rows [BLOCK_N, 1]
    pointers); w_first: the first W tile, loaded before the wait (used with PREFETCH). Returns the [BLOCK_N] fp32
    sums, before bias and rounding. store_residual: this program stores x + r (the new residual)."""
    ks = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 2:  # pass 1: each row's sum of squares (and program 0 stores x + r)
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, NORM_K):  # wide chunks: few L2 round trips before the weight stream
            k = k0 + tl.arange(0, NORM_K)
            mask = (rows < M)[:, None] & (k < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=mask, other=0.0)
            if PROLOGUE == 2:
                r = tl.load(r_ptr + rows[:, None] * stride_rm + k[None, :], mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                if store_residual:
                    tl.store(new_r_ptr + rows[:, None] * K + k[None, :], x, mask=mask)
            xf = x.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1)
        rstd = tl.rsqrt(sq / K + eps)

    w_next = w_first
    acc_1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)  # one row: reduce over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        if PREFETCH:  # this order ran at 4.06 ms a step; another cost ~10% (perf.md; python -m tools.gemv_ptx)
            w_raw = w_next
            w = w_raw.to(tl.float32)
            k_next = k0 + BLOCK_K + ks
            w_next = tl.load(w_rows + k_next[None, :], mask=col_mask[:, None] & (k_next < K)[None, :], other=0.0)
            k = k0 + ks
            k_mask = k < K
        else:
            k = k0 + ks
            k_mask = k < K
            w_raw = tl.load(w_rows + k[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0)
            w = w_raw.to(tl.float32)
        x = _x_row(x_ptr, r_ptr, nw_ptr, 0, M, k, k_mask, stride_xm, stride_rm, tl.sum(rstd, axis=0), K,
                   PROLOGUE)
        acc_1 += w * x[None, :]
    return tl.sum(acc_1, axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, bias_ptr, out_ptr, new_r_ptr,
    M, N, K, stride_xm, stride_rm, stride_wn, stride_om, eps,
    PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    # weights are never written during a step: the first tile may load before the wait (dead without PREFETCH)
    w_first = tl.load(w_rows + ks[None, :], mask=col_mask[:, None] & (ks < K)[None, :], other=0.0)
    pdl_wait(USE_PDL)  # everything below may read the previous kernel's output
    acc = one_row_loop(x_ptr, r_ptr, nw_ptr, new_r_ptr, w_rows, w_first, col_mask, M, K, stride_xm, stride_rm, eps,
                       pid == 0, PROLOGUE, BLOCK_M, BLOCK_N, BLOCK_K, NORM_K, PREFETCH)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out_offs = rows[:, None] * stride_om + cols[None, :]
    # rounded to x's dtype first, as a linear's output then cast (.float()) would be: one kernel fewer
    out = acc.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + out_offs, out, mask=(rows < M)[:, None] & col_mask[None, :])


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, prologue: str = "none",
                norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
                config: GemvConfig | None = None, out_dtype: torch.dtype | None = None, epilogue: str = "none"):
    """out_dtype: the output's dtype (default x's); values are rounded to x's dtype first (the LM head writes
    its logits as float32 without a cast kernel). Returns out, or (out, new residual) for add_norm."""
    assert supports(x, weight, prologue, epilogue), "shape/dtype not handled by the GEMV"
    assert (prologue == "add_norm") == (residual is not None)
    assert (prologue in ("norm", "add_norm")) == (norm_weight is not None)
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(-1) == 1
    m = x.shape[0]
    n, k = weight.shape
    config = config or default_config(n // (2 if epilogue == "silu_mul" else 1), k, m, prologue, epilogue)
    assert not config.dot or config.block_n >= 16, "tl.dot needs 16 rows of W"
    assert config.dot or m == 1, "more than one row runs on tensor cores (GemvConfig.dot)"
    assert config.dot or epilogue == "none", "the SiLU-mul epilogue runs on tensor cores (GemvConfig.dot)"
    if config.dot:
        out, new_residual = gemv_rows_triton(x, weight, bias, prologue, norm_weight, eps, residual, config.block_n,
                                             config.block_k, config.num_warps, config.num_stages,
                                             epilogue == "silu_mul", out_dtype)
        return (out, new_residual) if prologue == "add_norm" else out
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    new_residual = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else out
    use_pdl = pdl_for(x)
    _gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else weight, weight,
        bias if bias is not None else weight, out, new_residual,
        m, n, k, x.stride(0), residual.stride(0) if residual is not None else 0, weight.stride(0), out.stride(0),
        eps,
        PROLOGUE=PROLOGUES[prologue], HAS_BIAS=bias is not None, USE_PDL=use_pdl,
        BLOCK_M=1, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        NORM_K=min(triton.next_power_of_2(k), max(config.block_k, 4096)),
        PREFETCH=config.num_stages == 1, num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=use_pdl,
    )
    return (out, new_residual) if prologue == "add_norm" else out
