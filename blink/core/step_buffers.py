"""The fixed device tensors one forward step reads and writes.

A CUDA graph for a bucket (T tokens, S sequences) reads the first T / S entries of these tensors, so
filling them and replaying the graph runs a new step. Host mode fills them from the CPU; device mode's
scheduler kernel writes them on the GPU (one set per parity, so step N+1 can be prepared while N runs).
Padding: sequences past the real ones have q_len 0 and seq_len 0; tokens past the real ones slot -1;
rows that must not count a sampled token use the scratch sampling slot (= max_num_seqs).

Prompt logprobs: P rows per step (limits.prompt_logprob_rows), each a token row of the step whose logits
give the logprob of the next prompt token; a graph for bucket (T, S) reads the first min(P, T). Padding
rows have target -1 (the kernel skips them).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from blink.model.attention_metadata import AttentionMetadata
from blink.request import MAX_TOP_LOGPROBS


@dataclass
class StepBuffers:
    input_ids: torch.Tensor  # [Tmax] int64
    positions: torch.Tensor  # [Tmax] int64
    slot_mapping: torch.Tensor  # [Tmax] int64, -1 = padding
    query_start_loc: torch.Tensor  # [Smax+1] int32
    seq_lens: torch.Tensor  # [Smax] int32, KV length after this step
    block_tables: torch.Tensor  # [Smax, max_blocks_per_seq] int32
    logits_indices: torch.Tensor  # [Smax] int64, token row sampled for each sequence
    sample_slots: torch.Tensor  # [Smax] int32, sampling-state slot (scratch slot = no count)
    sample_positions: torch.Tensor  # [Smax] int64, absolute position of the sampled token (RNG key)
    sampled_ids: torch.Tensor  # [Smax] int64 (output)
    logprobs: torch.Tensor  # [Smax] float32 (output)
    top_ids: torch.Tensor  # [Smax, MAX_TOP_LOGPROBS] int64 (output)
    top_logprobs: torch.Tensor  # [Smax, MAX_TOP_LOGPROBS] float32 (output)
    # prompt logprobs (blink/kernels/prompt_logprobs.py), P rows
    prompt_rows: torch.Tensor  # [P] int64: token row in the step
    prompt_targets: torch.Tensor  # [P] int64: the prompt token at the next position, -1 = padding
    prompt_num_top: torch.Tensor  # [P] int32: top logprobs wanted
    prompt_logprob: torch.Tensor  # [P] float32 (output)
    prompt_rank: torch.Tensor  # [P] int32 (output)
    prompt_top_ids: torch.Tensor  # [P, MAX_TOP_LOGPROBS] int64 (output)
    prompt_top_logprobs: torch.Tensor  # [P, MAX_TOP_LOGPROBS] float32 (output)

    @classmethod
    def layout(cls, max_tokens: int, max_seqs: int, max_blocks_per_seq: int,
               prompt_rows: int = 0) -> list[tuple[str, tuple, torch.dtype]]:
        """(field, shape, dtype) in field order."""
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        t, s, k, p = (max_tokens,), (max_seqs,), MAX_TOP_LOGPROBS, (prompt_rows,)
        return [("input_ids", t, i64), ("positions", t, i64), ("slot_mapping", t, i64),
                ("query_start_loc", (max_seqs + 1,), i32), ("seq_lens", s, i32),
                ("block_tables", (max_seqs, max_blocks_per_seq), i32), ("logits_indices", s, i64),
                ("sample_slots", s, i32), ("sample_positions", s, i64), ("sampled_ids", s, i64),
                ("logprobs", s, f32), ("top_ids", (max_seqs, k), i64), ("top_logprobs", (max_seqs, k), f32),
                ("prompt_rows", p, i64), ("prompt_targets", p, i64), ("prompt_num_top", p, i32),
                ("prompt_logprob", p, f32), ("prompt_rank", p, i32), ("prompt_top_ids", (prompt_rows, k), i64),
                ("prompt_top_logprobs", (prompt_rows, k), f32)]

    @classmethod
    def nbytes(cls, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, prompt_rows: int = 0) -> int:
        return sum(_aligned(_size(shape, dtype)) for _, shape, dtype in cls.layout(max_tokens, max_seqs,
                                                                                     max_blocks_per_seq, prompt_rows))

    @classmethod
    def allocate(cls, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device,
                 arena: torch.Tensor | None = None, prompt_rows: int = 0) -> StepBuffers:
        """Every field a view of one byte arena (its own, or `arena`, at least nbytes() long): one
        allocation that device-mode tensor parallelism can map into rank 0's address space in one go."""
        if arena is None:
            arena = torch.zeros(cls.nbytes(max_tokens, max_seqs, max_blocks_per_seq, prompt_rows), dtype=torch.uint8,
                                device=device)
        views, offset = {}, 0
        for name, shape, dtype in cls.layout(max_tokens, max_seqs, max_blocks_per_seq, prompt_rows):
            n = _size(shape, dtype)
            views[name] = arena[offset:offset + n].view(dtype).view(shape)
            offset += _aligned(n)
        views["slot_mapping"].fill_(-1)
        views["prompt_targets"].fill_(-1)
        return cls(**views)

    def attention(self, num_tokens: int, num_seqs: int,
                  split_tickets: torch.Tensor | None = None) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            seq_lens=self.seq_lens[:num_seqs],
            block_tables=self.block_tables[:num_seqs],
            split_tickets=split_tickets,
        )

    def pointers(self) -> dict[str, int]:
        """Device addresses of every buffer, for the device-mode scheduler kernel."""
        return {f.name: getattr(self, f.name).data_ptr() for f in fields(self)}


ALIGN = 256  # bytes: every field starts on a boundary any kernel's vector loads accept


def _size(shape: tuple, dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN

