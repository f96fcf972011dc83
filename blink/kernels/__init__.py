"""Kernels: each op runs its Triton kernel on CUDA tensors and its torch reference otherwise."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from blink.kernels import gemv as gemv_module
from blink.kernels.activation import silu_and_mul_ref, silu_and_mul_triton
from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.gemv import GemvPlan, gemv_triton
from blink.kernels.gemv import supports as gemv_supports
from blink.kernels.gemv_rope import gemv_rope_kv_triton
from blink.kernels.gemv_rope import supports as gemv_rope_supports
from blink.kernels.kv_write import write_kv_ref, write_kv_triton
from blink.kernels.rmsnorm import rms_norm_ref, rms_norm_triton
from blink.kernels.rope import (
    apply_rope_ref,
    apply_rope_triton,
    rope_and_write_kv_ref,
    rope_and_write_kv_triton,
)
from blink.kernels.widen import widen_triton

__all__ = ["write_kv", "paged_attention", "rms_norm", "apply_rope", "silu_and_mul", "rope_and_write_kv",
           "linear", "norm_linear", "silu_epilogue_takes", "qkv_rope_takes", "norm_linear_rope_kv"]


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    impl = write_kv_triton if k.is_cuda else write_kv_ref
    impl(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, split_tickets: torch.Tensor | None = None) -> torch.Tensor:
    if not q.is_cuda:
        return paged_attention_ref(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale)
    return paged_attention_triton(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                                  split_tickets=split_tickets)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    impl = rms_norm_triton if x.is_cuda else rms_norm_ref
    return impl(x, weight, eps, residual)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
    impl = apply_rope_triton if q.is_cuda else apply_rope_ref
    return impl(q, k, positions, cos_sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    impl = silu_and_mul_triton if x.is_cuda else silu_and_mul_ref
    return impl(x)


def rope_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                      cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                      k_norm_weight: torch.Tensor | None = None, eps: float = 0.0):
    """(q/k RMSNorm,) RoPE on q and k in place, then k and v into the cache: one launch. Returns (q, k)."""
    impl = rope_and_write_kv_triton if q.is_cuda else rope_and_write_kv_ref
    return impl(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, q_norm_weight, k_norm_weight, eps)


def _triton_device(x: torch.Tensor) -> bool:
    return x.is_cuda  # tests patch this to run the GEMV path under the interpreter


def _gemv_takes(x: torch.Tensor, weight: torch.Tensor, gemv: GemvPlan | None, prologue: str,
                epilogue: str = "none") -> bool:
    """Shapes only, so the same choice is made at every capture of a bucket."""
    return (gemv is not None and _triton_device(x) and x.dim() == 2 and x.shape[0] <= gemv.max_m
            and gemv_supports(x, weight, prologue, epilogue))


def silu_epilogue_takes(x: torch.Tensor, gate_up_weight: torch.Tensor, gemv: GemvPlan | None) -> bool:
    """Whether norm_linear(..., silu_mul_out=True) would fuse the SiLU-mul into gate|up's GEMV: from two rows on.
    One row keeps it in down_proj's prologue (the CUDA-core loop's tiles were tuned for that: perf.md)."""
    return x.dim() == 2 and x.shape[0] > 1 and _gemv_takes(x, gate_up_weight, gemv, "add_norm", "silu_mul")


def _qkv_rope_config(x: torch.Tensor, weight: torch.Tensor, gemv: GemvPlan):
    # through the module: tests swap gemv.default_config for tiles the interpreter runs quickly
    return gemv.config or gemv_module.default_config(weight.shape[0], weight.shape[1], x.shape[0], "add_norm")


def qkv_rope_takes(x: torch.Tensor, qkv_weight: torch.Tensor, gemv: GemvPlan | None, head_dim: int) -> bool:
    """Whether norm_linear_rope_kv runs qkv with RoPE and the KV write in its epilogue: a plan that asks for it
    (GemvPlan.rope_kv), head-aligned tiles of the call's kernel (gemv_rope.supports: one row on the CUDA-core loop,
    more on tensor cores; shapes only, so graph-safe)."""
    return (gemv is not None and gemv.rope_kv and _gemv_takes(x, qkv_weight, gemv, "add_norm")  # 2-D, <= max_m
            and gemv_rope_supports(x, qkv_weight, head_dim, _qkv_rope_config(x, qkv_weight, gemv)))


def norm_linear_rope_kv(x, norm_weight, eps, weight, bias, residual, gemv: GemvPlan, positions, cos_sin, k_cache,
                        v_cache, slot_mapping, num_q_heads: int, num_kv_heads: int):
    """qkv = linear(rms_norm(x [+ residual])) with q and k rotated in place and k, v written to the cache, in one
    kernel (where qkv_rope_takes). Returns (qkv, the new residual or None)."""
    prologue = "norm" if residual is None else "add_norm"
    return gemv_rope_kv_triton(x, weight, bias, prologue, norm_weight, eps, residual, positions, cos_sin, k_cache,
                               v_cache, slot_mapping, num_q_heads, num_kv_heads, _qkv_rope_config(x, weight, gemv))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           silu_mul_input: bool = False, gemv: GemvPlan | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """F.linear (cuBLAS). With silu_mul_input, x is a gate|up output and silu_and_mul is applied first.
    With a GemvPlan (decided per layer at load time), decode-sized calls run the GEMV, silu_mul fused.
    out_dtype: the output cast to it (the GEMV writes it directly, rounded through x's dtype the same way)."""
    if _gemv_takes(x, weight, gemv, "silu_mul" if silu_mul_input else "none"):
        return gemv_triton(x, weight, bias, "silu_mul" if silu_mul_input else "none", config=gemv.config,
                           out_dtype=out_dtype)
    if silu_mul_input:
        x = silu_and_mul(x)
    out = F.linear(x, weight, bias)
    if out_dtype is None or out.dtype == out_dtype:
        return out
    if out.is_cuda and out_dtype == torch.float32 and out.is_contiguous():
        return widen_triton(out)  # torch's casting copy does not stream (widen.py)
    return out.to(out_dtype)


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                gemv: GemvPlan | None = None, silu_mul_out: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """linear(rms_norm(x [+ residual])): one GEMV kernel when the plan takes the call, else the norm kernel
    and cuBLAS. With silu_mul_out (weight is gate|up) the output is silu(gate) * up, from the GEMV's epilogue
    or the SiLU-mul kernel. Returns (y, the new residual x + residual, or None without a residual)."""
    prologue = "norm" if residual is None else "add_norm"
    epilogue = "silu_mul" if silu_mul_out else "none"
    if _gemv_takes(x, weight, gemv, prologue, epilogue) and (residual is None or residual.stride(-1) == 1):
        out = gemv_triton(x, weight, bias, prologue, norm_weight, eps, residual, gemv.config, epilogue=epilogue)
        return out if residual is not None else (out, None)
    new_residual = None
    if residual is None:
        normed = rms_norm(x, norm_weight, eps)
    else:
        normed, new_residual = rms_norm(x, norm_weight, eps, residual)
    out = F.linear(normed, weight, bias)
    return (silu_and_mul(out) if silu_mul_out else out), new_residual
