"""Per-step time floor on the H200: max(bytes / copy bandwidth, FLOPs / bf16 GEMM rate).

Both ceilings were measured on the H200 lent here (DESIGN.md): 4.29 TB/s device-to-device copy (read +
write; a read-only stream can beat it slightly, so ratios to this floor are a proxy) and 790 TFLOP/s for
a large bf16 GEMM on random data.
"""
from __future__ import annotations

from dataclasses import dataclass

COPY_BW = 4.29e12
GEMM_RATE = 790e12


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2

    @classmethod
    def of(cls, cfg, dtype_bytes: int = 2) -> ModelShape:
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                   cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, dtype_bytes)

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through (all layers + LM head; not the embedding lookup)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (qkv + o + mlp) + self.hidden * self.vocab

    def step_floor_s(self, tokens: int, kv_read_tokens: int, attn_pairs: int) -> float:
        """tokens: tokens in the step; kv_read_tokens: KV entries read (summed over sequences);
        attn_pairs: query-key pairs scored (summed over sequences)."""
        kv_bytes = kv_read_tokens * self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes
        weight_bytes = self.matmul_params * self.dtype_bytes
        flops = 2 * self.matmul_params * tokens + 4 * attn_pairs * self.heads * self.head_dim * self.layers
        return max((weight_bytes + kv_bytes) / COPY_BW, flops / GEMM_RATE)

    def decode_floor_s(self, batch: int, context: int) -> float:
        return self.step_floor_s(batch, batch * context, batch * context)
