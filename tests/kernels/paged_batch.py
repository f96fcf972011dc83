"""Builds random paged-attention batches (logical K/V per sequence scattered into a shuffled block pool)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blink.kernels.kv_write import write_kv_ref


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D], T includes padding tokens
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor  # [S+1] int32, S includes padding sequences
    seq_lens: torch.Tensor  # [S] int32
    block_tables: torch.Tensor  # [S, max_blocks] int32
    keys: list[torch.Tensor]  # dense [seq_len, Hkv, D] per sequence, for the naive oracle
    values: list[torch.Tensor]
    num_real_tokens: int


def make_paged_batch(q_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int,
                     head_dim: int, block_size: int, dtype=torch.float32, device="cpu",
                     pad_seqs: int = 0, pad_tokens: int = 0, max_blocks: int | None = None,
                     seed: int = 0) -> PagedBatch:
    gen = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(shape, generator=gen, device=device).to(dtype)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    width = max_blocks or max(1, max(blocks_per_seq))
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage a kernel must not read
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = randn(*shape) * 4, randn(*shape) * 4  # garbage everywhere first
    order = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    block_tables = torch.zeros((len(seq_lens) + pad_seqs, width), dtype=torch.int32, device=device)
    keys, values, used = [], [], 0
    for s, n in enumerate(seq_lens):
        block_tables[s, : blocks_per_seq[s]] = order[used : used + blocks_per_seq[s]]
        used += blocks_per_seq[s]
        k, v = randn(n, num_kv_heads, head_dim), randn(n, num_kv_heads, head_dim)
        pos = torch.arange(n, device=device)
        slots = block_tables[s, pos // block_size].long() * block_size + pos % block_size
        write_kv_ref(k, v, k_cache, v_cache, slots)
        keys.append(k)
        values.append(v)
    num_real = sum(q_lens)
    q = randn(num_real + pad_tokens, num_q_heads, head_dim)
    starts = [0]
    for n in q_lens + [0] * pad_seqs:
        starts.append(starts[-1] + n)
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens + [0] * pad_seqs, dtype=torch.int32, device=device),
        block_tables=block_tables, keys=keys, values=values, num_real_tokens=num_real,
    )


def naive_attention(batch: PagedBatch, q_lens: list[int], scale: float) -> torch.Tensor:
    """Dense causal attention in float64, one head at a time (CPU tensors): the oracle for the reference."""
    num_q_heads, num_kv_heads = batch.q.shape[1], batch.keys[0].shape[1] if batch.keys else 1
    out = torch.zeros(batch.num_real_tokens, num_q_heads, batch.q.shape[2], dtype=torch.float64)
    start = 0
    for q_len, k, v in zip(q_lens, batch.keys, batch.values, strict=True):
        seq_len = k.shape[0]
        for h in range(num_q_heads):
            kv_head = h // (num_q_heads // num_kv_heads)
            q = batch.q[start : start + q_len, h].double()
            scores = q @ k[:, kv_head].double().T * scale
            for i in range(q_len):
                scores[i, seq_len - q_len + i + 1 :] = float("-inf")
            out[start : start + q_len, h] = torch.softmax(scores, dim=-1) @ v[:, kv_head].double()
        start += q_len
    return out
