"""RMSNorm, optionally fused with the residual add that precedes it (HF Llama/Qwen semantics).

x may be [N, H] or [T, heads, head_dim] (Qwen3's q_norm/k_norm on a strided q/k view); the last dim must
have stride 1. The sum x + residual is rounded to the model dtype before normalizing, and the normalized
value is rounded before the weight multiply, exactly as HF's LlamaRMSNorm does, so outputs match HF.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.pdl import pdl_for, pdl_wait


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    if residual is not None:
        x = x + residual
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * normed.to(x.dtype)).to(x.dtype)
    return out if residual is None else (out, x)


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr,
    num_rows, inner_rows, stride_x0, stride_x1, stride_r0, stride_r1, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_mask = rows < num_rows
    mask = row_mask[:, None] & (cols[None, :] < hidden)
    # A row is (outer, inner) in the 3-D view; strides make non-contiguous q/k slices work.
    outer = (rows // inner_rows).to(tl.int64)
    inner = (rows % inner_rows).to(tl.int64)
    x_offs = (outer * stride_x0 + inner * stride_x1)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0)
    out_offs = rows.to(tl.int64)[:, None] * hidden + cols[None, :]  # outputs are contiguous
    if HAS_RESIDUAL:
        r_offs = (outer * stride_r0 + inner * stride_r1)[:, None] + cols[None, :]
        r = tl.load(residual_ptr + r_offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + out_offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / hidden + eps)
    normed = (xf * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_offs, (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    assert t.stride(-1) == 1, "the normalized dim must be contiguous"
    return t.unsqueeze(1) if t.dim() == 2 else t


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    x3 = _as_3d(x)
    outer, inner, hidden = x3.shape
    num_rows = outer * inner
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else out
    r3 = _as_3d(residual) if residual is not None else x3
    block_h = triton.next_power_of_2(hidden)
    block_rows = max(1, min(16, 2048 // block_h))  # several short rows (q/k norm) per program
    grid = (triton.cdiv(num_rows, block_rows),)
    use_pdl = pdl_for(x)
    _rms_norm_kernel[grid](
        x3, r3, weight, out, new_residual,
        num_rows, inner, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_ROWS=block_rows, BLOCK_H=block_h, USE_PDL=use_pdl,
        num_warps=4 if block_h <= 2048 else 8, launch_pdl=use_pdl,
    )
    return out if residual is None else (out, new_residual)
