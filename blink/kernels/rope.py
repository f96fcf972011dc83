"""Rotary embedding, neox / rotate_half style, applied in place to q and k.

cos_sin[max_pos, D] float32 holds cos in its first D/2 columns and sin in the last D/2. q and k may be
strided views (e.g. slices of a fused qkv output) as long as head_dim is contiguous. Rotation is computed in
fp32 and rounded once. Positions outside [0, max_pos) are clamped (padding tokens may carry any value; this
keeps a captured graph from reading out of bounds).

rope_and_write_kv fuses one attention layer's small steps into one launch per step: Qwen3's per-head
q/k RMSNorm (optional), the rotation of q and k (in place), and the scatter of k and v into the paged cache.
Its reference is the composition of the existing references, so the rounding points are the same.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.kv_write import write_kv_ref
from blink.kernels.pdl import pdl_for, pdl_wait
from blink.kernels.rmsnorm import rms_norm_ref


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


def rope_and_write_kv_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                          cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                          k_norm_weight: torch.Tensor | None = None, eps: float = 0.0):
    if q_norm_weight is not None:
        q.copy_(rms_norm_ref(q, q_norm_weight, eps))
        k.copy_(rms_norm_ref(k, k_norm_weight, eps))
    apply_rope_ref(q, k, positions, cos_sin)
    write_kv_ref(k, v, k_cache, v_cache, slot_mapping)
    return q, k


@triton.jit
def _norm_rotate_heads(x_ptr, norm_w_ptr, token, stride_t, stride_h, num_heads, cos, sin, half, eps,
                       HAS_NORM: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """(Optionally RMS-normalize and) rotate each head of one token in place; returns the stored halves."""
    heads = tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < num_heads) & (cols[None, :] < half)
    offs = token * stride_t + heads[:, None].to(tl.int64) * stride_h + cols[None, :]
    dtype = x_ptr.dtype.element_ty
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:  # same rounding points as rms_norm_ref: normalized value, then times the weight
        rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)[:, None]
        w1 = tl.load(norm_w_ptr + cols, mask=cols < half, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(norm_w_ptr + half + cols, mask=cols < half, other=0.0).to(tl.float32)[None, :]
        x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    out1 = (x1 * cos - x2 * sin).to(dtype)
    out2 = (x2 * cos + x1 * sin).to(dtype)
    tl.store(x_ptr + offs, out1, mask=mask)
    tl.store(x_ptr + offs + half, out2, mask=mask)
    return out1, out2


@triton.jit
def _rope_and_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, positions_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    q_norm_ptr, k_norm_ptr, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_co, stride_ch,
    num_q_heads, num_kv_heads, half, max_pos, block_size,
    HAS_NORM: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    slot = tl.load(slot_mapping_ptr + token)
    pos = tl.minimum(tl.maximum(pos, 0), max_pos - 1).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_sin_ptr + pos * 2 * half + cols, mask=cols < half, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * 2 * half + half + cols, mask=cols < half, other=0.0)[None, :]
    pdl_wait(USE_PDL)  # positions, slots and the table predate the graph's kernels (pdl.py); q, k, v do not
    _norm_rotate_heads(q_ptr, q_norm_ptr, token, stride_qt, stride_qh, num_q_heads, cos, sin, half, eps,
                       HAS_NORM, BLOCK_QH, BLOCK_HALF)
    k1, k2 = _norm_rotate_heads(k_ptr, k_norm_ptr, token, stride_kt, stride_kh, num_kv_heads, cos, sin, half,
                                eps, HAS_NORM, BLOCK_KH, BLOCK_HALF)
    heads = tl.arange(0, BLOCK_KH)[:, None]
    mask = (heads < num_kv_heads) & (cols[None, :] < half) & (slot >= 0)
    cache_offs = (slot // block_size) * stride_cb + (slot % block_size) * stride_co + heads * stride_ch
    cache_offs += cols[None, :]
    cache_dtype = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + cache_offs, k1.to(cache_dtype), mask=mask)
    tl.store(k_cache_ptr + cache_offs + half, k2.to(cache_dtype), mask=mask)
    v_offs = token * stride_vt + heads * stride_vh + cols[None, :]
    v1 = tl.load(v_ptr + v_offs, mask=mask)
    v2 = tl.load(v_ptr + v_offs + half, mask=mask)
    tl.store(v_cache_ptr + cache_offs, v1.to(cache_dtype), mask=mask)
    tl.store(v_cache_ptr + cache_offs + half, v2.to(cache_dtype), mask=mask)


def rope_and_write_kv_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                             cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                             k_norm_weight: torch.Tensor | None = None, eps: float = 0.0):
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride() and slot_mapping.dtype == torch.int64
    assert cos_sin.is_contiguous() and cos_sin.dtype == torch.float32 and cos_sin.shape[1] == q.shape[-1]
    assert (q_norm_weight is None) == (k_norm_weight is None)
    tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    has_norm = q_norm_weight is not None
    use_pdl = pdl_for(q)
    _rope_and_write_kv_kernel[(tokens,)](
        q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
        q_norm_weight if has_norm else q, k_norm_weight if has_norm else k, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_q_heads, num_kv_heads, head_dim // 2, cos_sin.shape[0], k_cache.shape[1],
        HAS_NORM=has_norm, BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(num_kv_heads), BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        USE_PDL=use_pdl, launch_pdl=use_pdl,
    )
    return q, k
