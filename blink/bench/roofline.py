"""Per-step time floor on the H200: max(bytes / copy bandwidth, FLOPs / bf16 GEMM rate).

Both ceilings were measured on the H200 lent here (DESIGN.md): 4.29 TB/s device-to-device copy (read +
write; a read-only stream can beat it slightly, so ratios to this floor are a proxy) and 790 TFLOP/s for
a large bf16 GEMM on random data.

Mixture of experts: a step reads only the experts its tokens are routed to. The floor counts, per sparse
layer, the expected number of distinct experts that `tokens` tokens touch when each picks top_k of E
uniformly (E * (1 - (1 - top_k/E)^tokens)), plus attention, the router and every dense weight; FLOPs
count top_k experts per token.
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
    moe_layers: int = 0  # layers whose MLP is a mixture of experts
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0

    @classmethod
    def of(cls, cfg, dtype_bytes: int = 2) -> ModelShape:
        moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                   cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, dtype_bytes, moe_layers,
                   cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size)

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through, experts aside (all layers' attention, the dense
        layers' MLPs, the routers, the LM head; not the embedding lookup)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        dense_layers = self.layers - self.moe_layers
        router = self.experts * self.hidden
        return self.layers * (qkv + o) + dense_layers * mlp + self.moe_layers * router + self.hidden * self.vocab

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.moe_intermediate

    def touched_experts(self, tokens: int) -> float:
        """Expected distinct experts per sparse layer under uniform routing (0 for a dense model)."""
        if not self.experts:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)

    def step_floor_s(self, tokens: int, kv_read_tokens: int, attn_pairs: int) -> float:
        """tokens: tokens in the step; kv_read_tokens: KV entries read (summed over sequences);
        attn_pairs: query-key pairs scored (summed over sequences)."""
        kv_bytes = kv_read_tokens * self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes
        expert_bytes = self.moe_layers * self.touched_experts(tokens) * self.expert_params * self.dtype_bytes
        weight_bytes = self.matmul_params * self.dtype_bytes + expert_bytes
        active = self.matmul_params + self.moe_layers * self.top_k * self.expert_params
        flops = 2 * active * tokens + 4 * attn_pairs * self.heads * self.head_dim * self.layers
        return max((weight_bytes + kv_bytes) / COPY_BW, flops / GEMM_RATE)

    def decode_floor_s(self, batch: int, context: int) -> float:
        return self.step_floor_s(batch, batch * context, batch * context)

    def prefill_flops(self, tokens: int, context: int = 0) -> tuple[float, float]:
        """(GEMM FLOPs, causal attention FLOPs) of one sequence's prefill chunk of `tokens` after `context`
        cached ones (0: from an empty cache): every layer's GEMMs on every token (top_k experts each), the LM
        head on the last token only; attention over the tokens * context + tokens * (tokens + 1) / 2 causal
        query-key pairs, 4 FLOPs per pair and head dim (QK^T and PV)."""
        lm_head = self.hidden * self.vocab
        active = self.matmul_params - lm_head + self.moe_layers * self.top_k * self.expert_params
        gemm = 2.0 * active * tokens + 2.0 * lm_head
        pairs = tokens * context + tokens * (tokens + 1) // 2
        attention = 4.0 * pairs * self.heads * self.head_dim * self.layers
        return gemm, attention

    def prefill_floor_s(self, tokens: int, context: int = 0) -> float:
        """The compute floor at GEMM_RATE (GEMMs and attention alike), or the weight read if that is longer."""
        weight_bytes = (self.matmul_params + self.moe_layers * self.experts * self.expert_params) * self.dtype_bytes
        return max(sum(self.prefill_flops(tokens, context)) / GEMM_RATE, weight_bytes / COPY_BW)
