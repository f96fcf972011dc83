"""Mixture-of-experts on the GPU: routing (softmax top-k), the sort of tokens by expert, and fused_moe.

Every step is decided on the GPU with shapes that depend only on the number of tokens T, so a step can be
captured in a bucket's CUDA graph and launched from the device: no .item(), no nonzero(), no host sync.

    route:  router logits [T, E] -> top-k expert ids [T, K] int32 and weights [T, K] float32
            (softmax in fp32, then top-k, then optionally renormalized over the k: norm_topk_prob)
    align:  the T*K (token, slot) pairs sorted by expert, each expert's run padded to a multiple of BLOCK_M,
            into a buffer sized for the worst case; block_expert[b] says which expert M-block b belongs
            to (E = unused block: its programs exit at once). The grid over the worst case stays fixed.
    gemm:   blink/kernels/moe_gemm.py: gate|up with silu*up fused, then down with the routing weight.
At decode sizes (up to gemv_pairs (token, expert) pairs, the model's choice: model/fusion.py) the experts run as
two weight streams instead of align + the grouped GEMMs + the sum (moe_gemv.py). At one row the whole sparse block
after attention (normed_block_triton) is three launches: the router as a one-row GEMV with the residual add and the
post-attention norm in its prologue (gemv.py), route, the streams (gate_up normalizing the residual sum itself).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels import moe_gemv
from blink.kernels.gemv import gemv_triton
from blink.kernels.gemv import supports as gemv_supports
from blink.kernels.moe_gemm import grouped_gemm_triton
from blink.kernels.rmsnorm import rms_norm_ref


def route_ref(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """As transformers' Qwen3-MoE router: softmax in fp32, top-k, optional renormalization."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids.to(torch.int32), weights


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, stride_t, num_experts,
                  TOP_K: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ks = tl.arange(0, BLOCK_K)
    x = tl.load(logits_ptr + token * stride_t + cols, mask=cols < num_experts, other=-float("inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    # A padding row of a bucket may hold garbage (NaN): its pick must still be a real expert, or its pair
    # would land outside every expert's run in the sort. NaN -> 0 keeps the argmax defined.
    p = tl.where((cols < num_experts) & (p == p), p, -1.0)
    p = tl.where((cols < num_experts) & (p < 0.0), 0.0, p)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for k in tl.static_range(TOP_K):  # k rounds of argmax; the smallest index wins a tie, as in topk
        best = tl.max(p, axis=0)
        idx = tl.minimum(tl.min(tl.where(p == best, cols, BLOCK_E), axis=0), num_experts - 1)
        top_w = tl.where(ks == k, best, top_w)
        top_i = tl.where(ks == k, idx, top_i)
        p = tl.where(cols == idx, -1.0, p)
    if RENORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(ids_ptr + token * TOP_K + ks, top_i, mask=ks < TOP_K)
    tl.store(weights_ptr + token * TOP_K + ks, top_w, mask=ks < TOP_K)


def route_triton(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    assert logits.dim() == 2 and logits.stride(-1) == 1
    tokens, experts = logits.shape
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    _route_kernel[(tokens,)](logits, ids, weights, logits.stride(0), experts, TOP_K=top_k,
                             RENORM=renormalize, BLOCK_E=triton.next_power_of_2(experts),
                             BLOCK_K=triton.next_power_of_2(top_k))
    return ids, weights


def block_m_for(pairs: int, num_experts: int) -> int:
    """Rows per expert tile: 16 while experts average at most 16 pairs (decode), 64 beyond (prefill)."""
    return 16 if pairs <= 16 * num_experts else 64


def sorted_capacity(pairs: int, num_experts: int, block_m: int) -> int:
    """Worst-case length of the padded sorted buffer: every non-empty expert wastes < block_m rows."""
    return triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m) * block_m


def align_ref(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids [capacity] int32: pair index t*K+k, or T*K for padding; block_expert [capacity/block_m]
    int32: expert of each M-block, num_experts for unused ones). Pairs keep their order within an expert.
    Fixed shapes and no host sync (capturable), like the kernel."""
    flat = ids.flatten().long()
    pairs = flat.numel()
    capacity = sorted_capacity(pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(pairs, device=ids.device) - (counts.cumsum(0) - counts)[flat[order]]
    sorted_ids = torch.full((capacity,), pairs, dtype=torch.int32, device=ids.device)
    sorted_ids[(ends - padded)[flat[order]] + rank] = order.to(torch.int32)
    starts = torch.arange(0, capacity, block_m, device=ids.device)
    block_expert = (ends[None, :] <= starts[:, None]).sum(1).to(torch.int32)
    return sorted_ids, block_expert


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, pairs, num_experts, capacity, num_blocks,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """One program: count per expert, pad, prefix-sum, then place each pair at its expert's next slot."""
    experts = tl.arange(0, BLOCK_E)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, pairs, CHUNK):
        e = tl.load(ids_ptr + start + offs, mask=start + offs < pairs, other=BLOCK_E)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    for start in range(0, capacity, CHUNK):
        tl.store(sorted_ptr + start + offs, pairs + tl.zeros((CHUNK,), dtype=tl.int32),
                 mask=start + offs < capacity)
    tl.debug_barrier()  # the padding fill above must land before the pairs below overwrite it
    seen = ends - padded  # next free slot of each expert
    for start in range(0, pairs, CHUNK):
        valid = start + offs < pairs
        e = tl.load(ids_ptr + start + offs, mask=valid, other=BLOCK_E)
        onehot = (e[:, None] == experts[None, :]).to(tl.int32)
        before = tl.cumsum(onehot, axis=0) - onehot  # same-expert pairs earlier in this chunk
        dest = tl.sum(onehot * (before + seen[None, :]), axis=1)
        tl.store(sorted_ptr + dest, (start + offs).to(tl.int32), mask=valid)
        seen += tl.sum(onehot, axis=0)
    for start in range(0, num_blocks, CHUNK):
        first_row = (start + offs) * BLOCK_M
        below = (ends[None, :] <= first_row[:, None]) & (experts[None, :] < num_experts)
        tl.store(block_expert_ptr + start + offs, tl.sum(below.to(tl.int32), axis=1),
                 mask=start + offs < num_blocks)


def align_triton(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = ids.numel()
    capacity = sorted_capacity(pairs, num_experts, block_m)
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(capacity // block_m, dtype=torch.int32, device=ids.device)
    block_e = triton.next_power_of_2(num_experts)
    _align_kernel[(1,)](ids.contiguous(), sorted_ids, block_expert, pairs, num_experts, capacity,
                        capacity // block_m, BLOCK_M=block_m, BLOCK_E=block_e,
                        CHUNK=max(16, min(256, 16384 // block_e)), num_warps=8)
    return sorted_ids, block_expert


def experts_ref(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
    """sum_k weights[t,k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t,k], expert by expert as
    transformers does (rounding to x's dtype after each projection). CPU path, not capturable."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    inter = w13.shape[1] // 2
    for e in torch.unique(ids).tolist():
        token, slot = torch.where(ids == e)
        gate_up = hidden[token] @ w13[e].t()
        act = (torch.nn.functional.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float())
        down = act.to(hidden.dtype) @ w2[e].t()
        out.index_add_(0, token, (down.float() * weights[token, slot, None]).to(hidden.dtype).float())
    return out.to(hidden.dtype)


def experts_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                   weights: torch.Tensor, gemv_pairs: int = 0) -> torch.Tensor:
    """The same sum through align + two grouped GEMMs; the k partial outputs are summed in fp32 (torch's
    sum accumulates half types in fp32) and rounded once. Up to gemv_pairs pairs: moe_gemv's two streams."""
    if ids.numel() <= gemv_pairs and moe_gemv.supports(hidden, w13, w2, ids.numel()) and ids.is_contiguous():
        return moe_gemv.experts_gemv_triton(hidden, w13, w2, ids, weights)
    tokens, top_k = ids.shape
    block_m = block_m_for(ids.numel(), w13.shape[0])
    sorted_ids, block_expert = align_triton(ids, w13.shape[0], block_m)
    act = grouped_gemm_triton(hidden, w13, sorted_ids, block_expert, block_m, top_k, gated=True)
    pair_out = grouped_gemm_triton(act, w2, sorted_ids, block_expert, block_m, top_k, gated=False,
                                   weights=weights)
    return pair_out.view(tokens, top_k, -1).sum(dim=1)


def fused_moe_ref(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  top_k: int, renormalize: bool, gemv_pairs: int = 0) -> torch.Tensor:
    """gemv_pairs picks the Triton path's kernels (fused_moe_triton); the sum they compute is this one."""
    ids, weights = route_ref(router_logits, top_k, renormalize)
    return experts_ref(hidden, w13, w2, ids, weights)


def fused_moe_triton(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     top_k: int, renormalize: bool, gemv_pairs: int = 0) -> torch.Tensor:
    """Five launches, no host sync: route, align, gate|up GEMM, down GEMM, the sum over k (three up to gemv_pairs
    pairs: route and moe_gemv's two streams)."""
    ids, weights = route_triton(router_logits, top_k, renormalize)
    return experts_triton(hidden, w13, w2, ids, weights, gemv_pairs)


def fused_moe(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              top_k: int, renormalize: bool, gemv_pairs: int = 0) -> torch.Tensor:
    """Routing and the experts in one call: Triton kernels on CUDA tensors, torch references otherwise."""
    if hidden.is_cuda:
        return fused_moe_triton(hidden, router_logits, w13, w2, top_k, renormalize, gemv_pairs)
    return fused_moe_ref(hidden, router_logits, w13, w2, top_k, renormalize, gemv_pairs)


def normed_block_takes(hidden: torch.Tensor, router_weight: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                       top_k: int, gemv_pairs: int) -> bool:
    """Shapes only (graph-safe): one row, its pairs within gemv_pairs, and both kernels' conditions."""
    return (hidden.dim() == 2 and hidden.shape[0] == 1 and top_k <= gemv_pairs
            and gemv_supports(hidden, router_weight, "add_norm") and moe_gemv.supports(hidden, w13, w2, top_k))


def normed_block_ref(hidden: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                     router_weight: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
                     renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's post-attention norm, router and experts as separate ops: (experts' sum, new residual)."""
    normed, new_residual = rms_norm_ref(hidden, norm_weight, eps, residual)
    logits = torch.nn.functional.linear(normed, router_weight)
    return fused_moe_ref(normed, logits, w13, w2, top_k, renormalize), new_residual


def normed_block_triton(hidden: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        router_weight: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
                        renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """normed_block_ref in three launches (normed_block_takes must hold): the router's GEMV normalizes
    hidden + residual in its prologue and stores the sum (the new residual); gate_up normalizes that sum again."""
    logits, new_residual = gemv_triton(hidden, router_weight, None, "add_norm", norm_weight, eps, residual)
    ids, weights = route_triton(logits, top_k, renormalize)
    out = moe_gemv.experts_gemv_triton(new_residual, w13, w2, ids, weights, norm_weight=norm_weight, eps=eps)
    return out, new_residual
