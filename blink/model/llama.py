"""The Llama-family decoder (Llama 3.x, Mistral, Qwen2/2.5, Qwen3, Phi-3/Phi-4 and the MoE models Qwen3-MoE,
Qwen2-MoE, Mixtral) over a paged KV cache. Sparse layers put a SparseMoeBlock (blink/model/moe.py) where
the MLP is.

One forward step takes a flat batch of T tokens from any mix of prefills and decodes:

    embed -> [ norm(+residual) -> qkv -> (q/k norm) -> rope -> write_kv -> paged_attention -> o_proj
               -> norm(+residual) -> gate|up -> silu_and_mul -> down ] x layers -> norm

(q/k norm, rope and write_kv run as one fused kernel.) Where a layer's linears take the GEMV (decode-sized
steps, chosen at load time by blink/model/fusion.py), each norm(+residual) runs in the prologue of the
GEMV after it and silu_and_mul in the down projection's (one row) or gate|up's epilogue (more rows), so a
dense layer is six launches: qkv, rope+kv, attention (+ its split merge), o, gate|up, down. Otherwise they are
their own kernels before cuBLAS.

Every shape depends only on T and the config, and nothing reads tensor values on the host, so a step can
be captured in a CUDA graph. Module and parameter names are HF's except for the fused projections
(qkv_proj, gate_up_proj), whose mapping from HF names lives in blink/model/weights.py.
"""
from __future__ import annotations

import torch
from torch import nn

from blink.kernels import norm_linear_rope_kv, paged_attention, qkv_rope_takes, rope_and_write_kv
from blink.model.attention_metadata import AttentionMetadata
from blink.model.config import ModelConfig
from blink.model.fusion import apply_fusion_policy, policy_from_env
from blink.model.layers import ColumnParallelLinear, RMSNorm, RowParallelLinear, VocabParallelEmbedding
from blink.model.moe import SparseMoeBlock
from blink.model.rope import rope_cos_sin

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (k_cache, v_cache)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype, tp=None):
        super().__init__()
        tp_size = 1 if tp is None else tp.size
        kv_shards = min(cfg.num_key_value_heads, tp_size)  # fewer KV heads than ranks: ranks share one
        self.num_heads = cfg.num_attention_heads // tp_size
        self.num_kv_heads = cfg.num_key_value_heads // kv_shards
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, {"q": cfg.q_size, "k": cfg.kv_size, "v": cfg.kv_size}, cfg.qkv_bias,
            device, dtype, tp, part_shards={"k": kv_shards, "v": kv_shards},
        )
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, cfg.o_proj_bias, device, dtype, tp)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, device, dtype)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, device, dtype)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions: torch.Tensor, qkv: torch.Tensor, attn: AttentionMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        """From the qkv projection's output (the layer runs it, with the input norm in front) to o_proj's."""
        q, k, v = self.heads(qkv)
        # Qwen3's per-head q/k RMSNorm, RoPE (in place) and the KV-cache write, in one kernel.
        q_norm_weight, k_norm_weight, eps = None, None, 0.0
        if self.q_norm is not None:
            q_norm_weight, k_norm_weight, eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
        q, k = rope_and_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, attn.slot_mapping,
                                 q_norm_weight, k_norm_weight, eps)
        return self.attend(q, attn, k_cache, v_cache)

    def heads(self, qkv: torch.Tensor):
        """Strided [T, heads, D] views of q, k and v in qkv: the kernels take any token/head stride."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return (q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def attend(self, q: torch.Tensor, attn: AttentionMetadata, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> torch.Tensor:
        """Attention of the rotated q over the cache (this step's K/V already in it), then o_proj."""
        out = paged_attention(q, k_cache, v_cache, attn.query_start_loc, attn.seq_lens, attn.block_tables,
                              self.scale, attn.split_tickets)
        return self.o_proj(out.reshape(q.shape[0], self.num_heads * self.head_dim))

    def rope_in_qkv(self, x: torch.Tensor) -> bool:
        """Whether qkv's GEMV rotates q and k and writes K/V itself for x (shapes and the plan: graph-safe)."""
        return self.q_norm is None and qkv_rope_takes(x, self.qkv_proj.weight, self.qkv_proj.gemv, self.head_dim)

    def qkv_roped(self, x, norm: RMSNorm, residual, positions, attn: AttentionMetadata, k_cache, v_cache, cos_sin):
        """qkv(norm(x [+ residual])) with q and k rotated and K/V in the cache, one kernel: (qkv, new residual)."""
        proj = self.qkv_proj
        return norm_linear_rope_kv(x, norm.weight, norm.eps, proj.weight, proj.bias, residual, proj.gemv, positions,
                                   cos_sin, k_cache, v_cache, attn.slot_mapping, self.num_heads, self.num_kv_heads)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype, tp=None):
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(
            cfg.hidden_size, {"gate": cfg.intermediate_size, "up": cfg.intermediate_size}, cfg.mlp_bias,
            device, dtype, tp,
        )
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias,
                                           device, dtype, tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(hidden), silu_mul_input=True)  # down(silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype, tp=None, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        self.self_attn = LlamaAttention(cfg, device, dtype, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        moe = cfg.is_moe_layer(layer)
        self.mlp = SparseMoeBlock(cfg, device, dtype, tp) if moe else LlamaMLP(cfg, device, dtype, tp)

    def forward(self, positions, hidden, residual, attn, k_cache, v_cache, cos_sin):
        """Returns (hidden, residual): the residual add is fused into the next layer's first norm."""
        sa = self.self_attn
        if sa.rope_in_qkv(hidden):  # RoPE and the KV write in qkv's epilogue (BLINK_QKV_ROPE)
            qkv, new_residual = sa.qkv_roped(hidden, self.input_layernorm, residual, positions, attn, k_cache,
                                             v_cache, cos_sin)
            residual = hidden if residual is None else new_residual
            hidden = sa.attend(sa.heads(qkv)[0], attn, k_cache, v_cache)
        else:
            qkv, new_residual = sa.qkv_proj.normed(hidden, self.input_layernorm, residual)
            residual = hidden if residual is None else new_residual
            hidden = sa(positions, qkv, attn, k_cache, v_cache, cos_sin)
        if isinstance(self.mlp, LlamaMLP):
            # 2+ rows on the GEMV: silu(gate) * up in gate|up's epilogue; else in down's prologue or its kernel
            fused = self.mlp.gate_up_proj.fuses_silu_mul(hidden)
            act, residual = self.mlp.gate_up_proj.normed(hidden, self.post_attention_layernorm, residual, fused)
            return self.mlp.down_proj(act, silu_mul_input=not fused), residual
        if self.mlp.takes_normed(hidden):  # one row, the experts as streams: the norm in the router's GEMV
            return self.mlp.normed(hidden, self.post_attention_layernorm, residual)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype, tp=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, device, dtype, tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, device, dtype, tp, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)

    def forward(self, input_ids, positions, attn, kv_caches: KVCaches, cos_sin) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, attn, k_cache, v_cache, cos_sin)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """forward(...) -> final hidden states [T, hidden]; compute_logits(hidden[N]) -> [N, vocab] float32.

    `max_positions` sizes the RoPE table (default: the config's max_position_embeddings). `tp` is this
    rank's TPGroup (None = one rank): the model then holds this rank's shard and its forward and
    compute_logits run the group's collectives, in the same order on every rank.
    """

    def __init__(self, cfg: ModelConfig, device, dtype: torch.dtype, tp=None, max_positions: int | None = None):
        super().__init__()
        check_tp_size(cfg, 1 if tp is None else tp.size)
        self.config = cfg
        self.model = LlamaModel(cfg, device, dtype, tp)
        if cfg.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens  # one module, so one (sharded) weight
        else:
            self.lm_head = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, device, dtype, tp)
        max_positions = max_positions or cfg.max_position_embeddings
        self.register_buffer("cos_sin", rope_cos_sin(cfg, max_positions, device), persistent=False)
        apply_fusion_policy(self, policy_from_env(1 if tp is None else tp.size))  # per projection and shape, once

    def gemv_projections(self):
        """(role, linear) of every projection the decode GEMV may take (model/fusion.py): the LM head, each
        layer's attention projections and a dense layer's MLP projections (MoE blocks keep their kernels)."""
        yield "lm_head", self.lm_head  # tied: the embedding module itself
        for layer in self.model.layers:
            yield "qkv", layer.self_attn.qkv_proj
            yield "o", layer.self_attn.o_proj
            if isinstance(layer.mlp, LlamaMLP):
                yield "gate_up", layer.mlp.gate_up_proj
                yield "down", layer.mlp.down_proj

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: KVCaches) -> torch.Tensor:
        return self.model(input_ids, positions, attn, kv_caches, self.cos_sin)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)


def local_kv_heads(cfg: ModelConfig, tp_size: int) -> int:
    """KV heads each rank holds: split across ranks, or one (replicated) when there are fewer than ranks."""
    return cfg.num_key_value_heads // min(cfg.num_key_value_heads, tp_size)


def check_tp_size(cfg: ModelConfig, tp_size: int) -> None:
    """One-line ValueError unless tp_size splits the heads and the MLP evenly."""
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    if tp_size < 1 or heads % tp_size:
        raise ValueError(f"--tensor-parallel-size {tp_size} does not divide the model's {heads} attention heads")
    if kv_heads % tp_size and tp_size % kv_heads:
        raise ValueError(f"--tensor-parallel-size {tp_size} neither divides nor is a multiple of the model's "
                         f"{kv_heads} KV heads")
    if cfg.intermediate_size % tp_size:
        raise ValueError(f"--tensor-parallel-size {tp_size} does not divide the intermediate size "
                         f"{cfg.intermediate_size}")
    if cfg.num_experts and cfg.moe_intermediate_size % tp_size:
        raise ValueError(f"--tensor-parallel-size {tp_size} does not divide the experts' intermediate size "
                         f"{cfg.moe_intermediate_size}")
    if cfg.shared_expert_intermediate_size % tp_size:
        raise ValueError(f"--tensor-parallel-size {tp_size} does not divide the shared expert's intermediate "
                         f"size {cfg.shared_expert_intermediate_size}")
