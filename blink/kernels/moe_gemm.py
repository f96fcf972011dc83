"""The experts' grouped GEMM over tokens sorted by expert (blink/kernels/moe.py's align).

The grid is fixed by the worst case, (capacity / BLOCK_M, N / BLOCK_N): an M-block reads its expert from
block_expert and its rows' pair indices from sorted_ids, so which expert a block multiplies by is decided
on the GPU; unused blocks (expert == E) exit at once and padding rows (pair == T*K) are masked.

    gated=True:  a = hidden [T, H] gathered by token (pair // K); w = w13 [E, 2I, H] (gate rows, then up
                 rows); out[sorted position] = silu(gate) * up   -> [capacity, I]
    gated=False: a = that activation [capacity, I] by sorted position; w = w2 [E, H, I];
                 out[pair] = routing weight * (a @ w^T)          -> [T*K, H]
Rounding follows transformers: each projection is rounded to the activation dtype before the next op.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, out_ptr, sorted_ptr, block_expert_ptr, weights_ptr,
                         n_out, k_dim, pairs, num_experts, stride_am, stride_we, stride_wn, stride_om,
                         TOP_K: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < num_experts:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # positions in the sorted buffer
        pair = tl.load(sorted_ptr + rows)
        valid = pair < pairs
        if GATED:
            a_rows = (pair // TOP_K).to(tl.int64)  # the token this pair routes
            out_rows = rows.to(tl.int64)
        else:
            a_rows = rows.to(tl.int64)
            out_rows = pair.to(tl.int64)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n_out
        ks = tl.arange(0, BLOCK_K)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            k_ok = k0 + ks < k_dim
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + (k0 + ks)[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            w_mask = col_ok[None, :] & k_ok[:, None]
            w = tl.load(w_base + cols[None, :].to(tl.int64) * stride_wn + (k0 + ks)[:, None], mask=w_mask,
                        other=0.0)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
            if GATED:
                w_up = tl.load(w_base + (cols + n_out)[None, :].to(tl.int64) * stride_wn + (k0 + ks)[:, None],
                               mask=w_mask, other=0.0)
                acc_up = tl.dot(a, w_up, acc_up, input_precision=PRECISION)
        dtype = out_ptr.dtype.element_ty
        if GATED:
            gate = acc.to(dtype).to(tl.float32)
            up = acc_up.to(dtype).to(tl.float32)
            result = gate * tl.sigmoid(gate) * up
        else:
            result = acc
            if WEIGHTED:
                routing = tl.load(weights_ptr + pair, mask=valid, other=0.0)
                result = result.to(dtype).to(tl.float32) * routing[:, None]
        tl.store(out_ptr + out_rows[:, None] * stride_om + cols[None, :], result.to(dtype),
                 mask=valid[:, None] & col_ok[None, :])


def _block(size: int, cap: int) -> int:
    return max(16, min(cap, triton.next_power_of_2(size)))


def grouped_gemm_triton(a: torch.Tensor, w: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                        block_m: int, top_k: int, gated: bool, weights: torch.Tensor | None = None) -> torch.Tensor:
    assert a.stride(-1) == 1 and w.is_contiguous() and a.dtype == w.dtype
    experts, rows, k_dim = w.shape
    n_out = rows // 2 if gated else rows
    capacity = sorted_ids.numel()
    pairs = a.shape[0] * top_k if gated else (weights.numel() if weights is not None else None)
    assert pairs is not None, "the down projection needs the routing weights"
    out_rows = capacity if gated else pairs
    out = torch.empty((out_rows, n_out), dtype=a.dtype, device=a.device)
    # Few M-blocks (decode): narrower N tiles, so that more programs stream the experts' weights.
    m_blocks = capacity // block_m
    block_n = _block(n_out, 64 if m_blocks * triton.cdiv(n_out, 64) >= 264 else 32)
    block_k = _block(k_dim, 64)
    grid = (m_blocks, triton.cdiv(n_out, block_n))
    _grouped_gemm_kernel[grid](
        a, w, out, sorted_ids, block_expert, weights if weights is not None else out,
        n_out, k_dim, pairs, experts, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        TOP_K=top_k, GATED=gated, WEIGHTED=weights is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",  # fp32 exact (no TF32)
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


def grouped_gemm_ref(a: torch.Tensor, w: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                     block_m: int, top_k: int, gated: bool, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's contract in torch, position by position (tests only: it gathers a weight per row).
    Rows the kernel leaves unwritten (padding positions) are zero here."""
    experts, rows, _ = w.shape
    n_out = rows // 2 if gated else rows
    pairs = a.shape[0] * top_k if gated else weights.numel()
    expert = block_expert.long().repeat_interleave(block_m)
    valid = (sorted_ids < pairs) & (expert < experts)
    pos = torch.nonzero(valid).flatten()
    pair = sorted_ids[pos].long()
    x = a[pair // top_k] if gated else a[pos]
    y = torch.einsum("mk,mnk->mn", x.float(), w[expert[pos]].float()).to(a.dtype).float()
    if gated:
        out = torch.zeros((sorted_ids.numel(), n_out), dtype=a.dtype, device=a.device)
        out[pos] = (torch.nn.functional.silu(y[:, :n_out]) * y[:, n_out:]).to(a.dtype)
        return out
    out = torch.zeros((pairs, n_out), dtype=a.dtype, device=a.device)
    out[pair] = (y * weights.flatten()[pair, None]).to(a.dtype)
    return out
