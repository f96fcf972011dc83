"""The fixed device tensors one forward step reads and writes.

A CUDA graph for a bucket (T tokens, S sequences) reads the first T / S entries of these tensors, so
filling them and replaying the graph runs a new step. Host mode fills them from the CPU; device mode's
scheduler kernel writes them on the GPU (one set per parity, so step N+1 can be prepared while N runs).
Padding: sequences past the real ones have q_len 0 and seq_len 0; tokens past the real ones slot -1;
rows that must not count a sampled token use the scratch sampling slot (= max_num_seqs).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from blink.model.attention_metadata import AttentionMetadata
from blink.transport.layout import MAX_TOP_LOGPROBS


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

    @classmethod
    def allocate(cls, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device) -> StepBuffers:
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        z = lambda *shape, dtype: torch.zeros(shape, dtype=dtype, device=device)
        return cls(
            input_ids=z(max_tokens, dtype=i64),
            positions=z(max_tokens, dtype=i64),
            slot_mapping=torch.full((max_tokens,), -1, dtype=i64, device=device),
            query_start_loc=z(max_seqs + 1, dtype=i32),
            seq_lens=z(max_seqs, dtype=i32),
            block_tables=z(max_seqs, max_blocks_per_seq, dtype=i32),
            logits_indices=z(max_seqs, dtype=i64),
            sample_slots=z(max_seqs, dtype=i32),
            sample_positions=z(max_seqs, dtype=i64),
            sampled_ids=z(max_seqs, dtype=i64),
            logprobs=z(max_seqs, dtype=f32),
            top_ids=z(max_seqs, MAX_TOP_LOGPROBS, dtype=i64),
            top_logprobs=z(max_seqs, MAX_TOP_LOGPROBS, dtype=f32),
        )

    def attention(self, num_tokens: int, num_seqs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            seq_lens=self.seq_lens[:num_seqs],
            block_tables=self.block_tables[:num_seqs],
        )

    def pointers(self) -> dict[str, int]:
        """Device addresses of every buffer, for the device-mode scheduler kernel."""
        return {f.name: getattr(self, f.name).data_ptr() for f in fields(self)}
