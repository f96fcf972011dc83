"""Rotary embedding, neox / rotate_half style, applied in place to q and k.

cos_sin[max_pos, D] float32 holds cos in its first D/2 columns and sin in the last D/2. q and k may be
strided views (e.g. slices of a fused qkv output) as long as head_dim is contiguous. Rotation is computed in
fp32 and rounded once. Positions outside [0, max_pos) are clamped (padding tokens may carry any value; this
keeps a captured graph from reading out of bounds).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x.copy_(rotated.to(x.dtype))


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
    half = q.shape[-1] // 2
    table = cos_sin[positions.clamp(0, cos_sin.shape[0] - 1)]
    cos, sin = table[:, None, :half], table[:, None, half:]
    _rotate_ref(q, cos, sin)
    _rotate_ref(k, cos, sin)
    return q, k


@triton.jit
def _rotate_heads(x_ptr, token, stride_t, stride_h, num_heads, cos, sin, half,
                  BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < num_heads) & (cols[None, :] < half)
    offs = token * stride_t + heads[:, None].to(tl.int64) * stride_h + cols[None, :]
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + offs, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(x_ptr + offs + half, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, positions_ptr, cos_sin_ptr,
                 stride_qt, stride_qh, stride_kt, stride_kh, num_q_heads, num_kv_heads, half, max_pos,
                 BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    pos = tl.minimum(tl.maximum(pos, 0), max_pos - 1).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_sin_ptr + pos * 2 * half + cols, mask=cols < half, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * 2 * half + half + cols, mask=cols < half, other=0.0)[None, :]
    _rotate_heads(q_ptr, token, stride_qt, stride_qh, num_q_heads, cos, sin, half, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(k_ptr, token, stride_kt, stride_kh, num_kv_heads, cos, sin, half, BLOCK_KH, BLOCK_HALF)


def apply_rope_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin.is_contiguous()
    assert cos_sin.dtype == torch.float32 and cos_sin.shape[1] == q.shape[-1]
    tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    _rope_kernel[(tokens,)](
        q, k, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_q_heads, num_kv_heads, head_dim // 2, cos_sin.shape[0],
        BLOCK_QH=triton.next_power_of_2(num_q_heads), BLOCK_KH=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q, k
