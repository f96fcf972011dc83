"""Prompt logprobs: per logits row, the log-softmax of the next prompt token, its rank and the top-N.

A row is the logits at prompt position p; its target is the prompt token at p + 1 (the first prompt token
has no logprob). Rows whose target is negative are padding: their program returns at once, so a captured
graph with a fixed number of rows costs almost nothing on steps that need none. The top-N are found by N
selection passes (largest below the previous one, ties by lower id) instead of a sort: no scratch memory,
and N <= 20 passes over the row are cheap next to the prefill that produced it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.request import MAX_TOP_LOGPROBS

_INT_MAX = tl.constexpr(0x7FFFFFFF)


@triton.jit
def _prompt_logprobs_kernel(logits_ptr, targets_ptr, num_top_ptr, logprob_ptr, rank_ptr, top_ids_ptr,
                            top_lps_ptr, vocab_size: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    target = tl.load(targets_ptr + row)
    if target >= 0:
        src = logits_ptr + row.to(tl.int64) * vocab_size
        # Pass 1: the row's maximum; pass 2: the normalizer and the target's rank.
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            best = tl.maximum(best, tl.load(src + offs, mask=offs < vocab_size, other=float("-inf")))
        row_max = tl.max(best, 0)
        target_logit = tl.load(src + target)
        total = tl.zeros([BLOCK], tl.float32)
        above = tl.zeros([BLOCK], tl.int32)
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))
            total += tl.exp(x - row_max)
            above += (x > target_logit).to(tl.int32)
        normalizer = row_max + tl.log(tl.sum(total, 0))
        tl.store(logprob_ptr + row, target_logit - normalizer)
        tl.store(rank_ptr + row, tl.sum(above, 0) + 1)
        # The top-N: each pass takes the largest (value, -id) strictly below the previous one.
        num_top = tl.load(num_top_ptr + row)
        prev_value = tl.full([], float("inf"), tl.float32)
        prev_id = tl.full([], -1, tl.int32)
        for k in range(0, num_top):
            lane_value = tl.full([BLOCK], float("-inf"), tl.float32)
            lane_id = tl.full([BLOCK], _INT_MAX, tl.int32)
            for start in range(0, vocab_size, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))
                ok = (offs < vocab_size) & ((x < prev_value) | ((x == prev_value) & (offs > prev_id)))
                better = ok & (x > lane_value)  # ids grow across tiles: an equal value keeps the lower id
                lane_value = tl.where(better, x, lane_value)
                lane_id = tl.where(better, offs, lane_id)
            value = tl.max(lane_value, 0)
            chosen = tl.min(tl.where(lane_value == value, lane_id, _INT_MAX), 0)
            tl.store(top_ids_ptr + row * K + k, chosen.to(tl.int64))
            tl.store(top_lps_ptr + row * K + k, value - normalizer)
            prev_value = value
            prev_id = chosen


def prompt_logprobs_triton(logits: torch.Tensor, targets: torch.Tensor, num_top: torch.Tensor,
                           logprob: torch.Tensor, rank: torch.Tensor, top_ids: torch.Tensor,
                           top_lps: torch.Tensor) -> None:
    """logits [P, V] float32; targets [P] int64 (-1 = padding); num_top [P] int32 (<= top_ids.shape[1]);
    writes logprob [P] f32, rank [P] int32, top_ids [P, K] int64, top_lps [P, K] f32 of non-padding rows."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    block = min(4096, triton.next_power_of_2(vocab))
    _prompt_logprobs_kernel[(rows,)](logits.contiguous(), targets, num_top, logprob, rank, top_ids, top_lps,
                                     vocab, top_ids.shape[1], block, num_warps=8)


def prompt_logprobs_ref(logits: torch.Tensor, targets: torch.Tensor, num_top: torch.Tensor,
                        logprob: torch.Tensor, rank: torch.Tensor, top_ids: torch.Tensor,
                        top_lps: torch.Tensor) -> None:
    """The torch reference (the CPU path and the test oracle), same contract as prompt_logprobs_triton."""
    valid = torch.nonzero(targets >= 0).flatten()
    if valid.numel() == 0:
        return
    x = logits[valid].float()
    lps = torch.log_softmax(x, dim=-1)
    tgt = targets[valid]
    target_logit = x.gather(1, tgt[:, None])
    logprob[valid] = lps.gather(1, tgt[:, None]).squeeze(1)
    rank[valid] = ((x > target_logit).sum(dim=1) + 1).to(rank.dtype)
    k = top_ids.shape[1]
    # Stable sort on the negated values: descending, ties by lower id (the kernel's order).
    order = torch.sort(-x, dim=1, stable=True).indices[:, :k]
    for i, r in enumerate(valid.tolist()):
        n = int(num_top[r])
        top_ids[r, :n] = order[i, :n]
        top_lps[r, :n] = lps[i, order[i, :n]]


def prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor, num_top: torch.Tensor, logprob: torch.Tensor,
                    rank: torch.Tensor, top_ids: torch.Tensor, top_lps: torch.Tensor) -> None:
    impl = prompt_logprobs_triton if logits.is_cuda else prompt_logprobs_ref
    impl(logits, targets, num_top, logprob, rank, top_ids, top_lps)


MAX_PROMPT_TOP = MAX_TOP_LOGPROBS  # vLLM's cap on prompt_logprobs; more is a 400
