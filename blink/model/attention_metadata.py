"""What one forward step needs to know about its sequences, as device tensors only.

Holding tensors (never Python numbers) lets a step be captured in a CUDA graph for a bucket of T tokens and
S sequences and replayed with new contents. See docs/architecture.md for the exact meaning of each field.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: flat KV slot per token; -1 = padding, not written
    query_start_loc: torch.Tensor  # [S+1] int32: cumulative query lengths; padding sequences add 0
    seq_lens: torch.Tensor  # [S] int32: KV length of each sequence after this step (0 for padding)
    block_tables: torch.Tensor  # [S, max_blocks_per_seq] int32: KV block ids of each sequence
    # Zeroed int32 counters that let a split KV range merge inside the attention kernel (kernels/attention_merge.py);
    # None: a second kernel merges. The runner owns them (one set for every layer and step: they run in order).
    split_tickets: torch.Tensor | None = None
