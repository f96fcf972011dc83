"""Scatter this step's K and V into the paged cache [num_blocks, block_size, Hkv, D].

slot = block * block_size + offset; slot -1 marks a padding token, which is skipped. k and v may be strided
views (slices of a fused qkv output) with a contiguous head_dim; the caches may have any strides.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cb, stride_co, stride_ch, num_heads, head_dim, block_size,
                     BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (cols < head_dim) & (slot >= 0)
    cache_offs = (slot // block_size) * stride_cb + (slot % block_size) * stride_co + heads * stride_ch + cols
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + cols, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + cols, mask=mask)
    tl.store(k_cache_ptr + cache_offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride() and slot_mapping.dtype == torch.int64
    tokens, num_heads, head_dim = k.shape
    _write_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), num_heads, head_dim, k_cache.shape[1],
        BLOCK_HEADS=triton.next_power_of_2(num_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
