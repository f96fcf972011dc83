"""The experts at decode sizes as two weight streams (issue 17's MoE lever): no sort, no padded tiles.

At batch 1 a Qwen3-30B-A3B layer routes one token to 8 of 128 experts, so the grouped GEMM (moe_gemm.py) runs
8 M-blocks of 16 rows with one real row each, after align's one-program sort and before a sum over k: five
launches a layer, and the step ran at 3.17x its floor (perf.md, session 4: 4.574 ms against 1.441). Here every
(token, expert) pair is a GEMV over its expert's rows, as gemv.py streams a dense weight:

    gate_up:  grid (pairs, I / BLOCK_N): pair p = (token p // K, expert ids[p]); act[p] = silu(x W_g^T) * (x W_u^T)
    down:     grid (tokens, H / BLOCK_N): out[t] = sum_k w[t, k] * (act[t, k] W2_e^T), the sum over k in the
              program (fp32, in k order), so no separate sum kernel

Three launches a layer with the router's (route, gate_up, down). The rounding points are experts_triton's
(moe.py): each projection rounded to the activation dtype, each pair's weighted output rounded, the sum in fp32
rounded once. A pair reads its expert's weights itself, so two tokens on one expert read it twice (from the L2
when they run together): the stream wins while pairs are few against the experts (MAX_PAIRS), the grouped GEMM
beyond. Which path runs depends on the token count only (the bucket), so graphs stay valid.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from blink.kernels.gemv import widest_filling

MAX_PAIRS = 64  # batch 8 at top-8: one pair in two experts (128); more pairs share experts and want the GEMM
_TILE = 4096  # W elements a program loads a step per weight (8 KB in bf16), as gemv.py's one-row tiles


@dataclass(frozen=True)
class MoeGemvConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


def default_config(rows_per_item: int, k: int, items: int) -> MoeGemvConfig:
    """gemv.py's width rule (widest_filling) over `items` x rows_per_item / BLOCK_N programs; K tiles of
    _TILE / BLOCK_N, at most K rounded up."""
    block_n = widest_filling((4, 8, 16, 2), lambda bn: items * triton.cdiv(rows_per_item, bn))
    return MoeGemvConfig(block_n, max(16, min(_TILE // block_n, triton.next_power_of_2(k))))


def supports(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, pairs: int) -> bool:
    """Shapes and dtypes only (graph-safe): few pairs, contiguous stacked weights of the activations' dtype."""
    return (pairs <= MAX_PAIRS and hidden.dim() == 2 and hidden.stride(-1) == 1 and w13.is_contiguous()
            and w2.is_contiguous() and hidden.dtype == w13.dtype == w2.dtype)


@triton.jit
def _gate_up_kernel(x_ptr, nw_ptr, w13_ptr, ids_ptr, act_ptr, H, I, stride_xt, stride_we, stride_wn, stride_ap, eps,
                    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr = False,
                    NORM_K: tl.constexpr = 1024):
    """NORM: x is the layer's residual sum and each program applies the post-attention RMSNorm to it (weight nw),
    with rmsnorm.py's rounding: its row's sum of squares in one pass over x first (H values, from the L2)."""
    pair = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < I
    token = pair // TOP_K
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    gate_rows = w13_ptr + expert * stride_we + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + I * stride_wn  # w13 holds the gate rows, then the up rows
    ks = tl.arange(0, BLOCK_K)
    dtype = act_ptr.dtype.element_ty
    rstd = 0.0
    if NORM:
        squares = tl.zeros([NORM_K], tl.float32)
        for k0 in range(0, H, NORM_K):
            k = k0 + tl.arange(0, NORM_K)
            xs = tl.load(x_ptr + token * stride_xt + k, mask=k < H, other=0.0).to(tl.float32)
            squares += xs * xs
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / H + eps)
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced over K once, after the loop (gemv.py)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + ks
        k_mask = k < H
        x = tl.load(x_ptr + token * stride_xt + k, mask=k_mask, other=0.0).to(tl.float32)
        if NORM:
            w = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            x = ((x * rstd).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
        x = x[None, :]
        w_mask = col_mask[:, None] & k_mask[None, :]
        acc_gate += tl.load(gate_rows + k[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
        acc_up += tl.load(up_rows + k[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
    gate = tl.sum(acc_gate, axis=1).to(dtype).to(tl.float32)  # the projection rounded, as gate_up's GEMM output
    up = tl.sum(acc_up, axis=1).to(dtype).to(tl.float32)
    tl.store(act_ptr + pair * stride_ap + cols, (gate * tl.sigmoid(gate) * up).to(dtype), mask=col_mask)


@triton.jit
def _down_kernel(act_ptr, w2_ptr, ids_ptr, weights_ptr, out_ptr, H, I, stride_ap, stride_we, stride_wn, stride_ot,
                 TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < H
    ks = tl.arange(0, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], tl.float32)
    for slot in tl.static_range(TOP_K):  # unrolled: the next pair's first loads need not wait for this sum
        pair = token * TOP_K + slot
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        routing = tl.load(weights_ptr + pair)
        rows = w2_ptr + expert * stride_we + cols.to(tl.int64)[:, None] * stride_wn
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + ks
            k_mask = k < I
            a = tl.load(act_ptr + pair * stride_ap + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            acc += tl.load(rows + k[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32) * a
        down = tl.sum(acc, axis=1).to(dtype).to(tl.float32)
        total += (down * routing).to(dtype).to(tl.float32)  # each pair's weighted output rounded (moe_gemm.py)
    tl.store(out_ptr + token * stride_ot + cols, total.to(dtype), mask=col_mask)


def experts_gemv_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                        weights: torch.Tensor, gate_up_config: MoeGemvConfig | None = None,
                        down_config: MoeGemvConfig | None = None, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0) -> torch.Tensor:
    """moe.experts_triton's result through the two streams (supports() must hold). With norm_weight, hidden is the
    residual sum and the experts see rms_norm_ref(hidden, norm_weight, eps), normalized inside gate_up."""
    assert supports(hidden, w13, w2, ids.numel()) and ids.is_contiguous()
    assert weights.shape == ids.shape and weights.is_contiguous()
    tokens, top_k = ids.shape
    _, hidden_size = hidden.shape
    inter = w13.shape[1] // 2
    pairs = tokens * top_k
    act = torch.empty((pairs, inter), dtype=hidden.dtype, device=hidden.device)
    out = torch.empty_like(hidden)
    up_cfg = gate_up_config or default_config(inter, hidden_size, pairs)
    _gate_up_kernel[(pairs, triton.cdiv(inter, up_cfg.block_n))](
        hidden, norm_weight if norm_weight is not None else hidden, w13, ids, act, hidden_size, inter,
        hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0), eps,
        TOP_K=top_k, BLOCK_N=up_cfg.block_n, BLOCK_K=up_cfg.block_k, NORM=norm_weight is not None,
        NORM_K=min(triton.next_power_of_2(hidden_size), 4096), num_warps=up_cfg.num_warps,
        num_stages=up_cfg.num_stages)
    down_cfg = down_config or default_config(hidden_size, inter, tokens)
    _down_kernel[(tokens, triton.cdiv(hidden_size, down_cfg.block_n))](
        act, w2, ids, weights, out, hidden_size, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        TOP_K=top_k, BLOCK_N=down_cfg.block_n, BLOCK_K=down_cfg.block_k, num_warps=down_cfg.num_warps,
        num_stages=down_cfg.num_stages)
    return out
