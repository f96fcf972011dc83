"""The sparse MoE block (Qwen3-MoE, Qwen2-MoE, Mixtral): a router and E gated experts, in place of the MLP.

    logits = x Wr^T -> softmax top-k (optionally renormalized) -> sum_k w_k * down_e(silu(gate_e x) * up_e x)
    Qwen2-MoE adds sigmoid(x . w_s) * shared_expert(x), a dense gated MLP every token goes through.

Routing and the expert GEMMs run on the GPU (blink/kernels/moe.py), with shapes fixed by the token count,
so the block is captured in the bucket graphs like the rest of the step.

Tensor parallelism shards every expert on its intermediate dimension: each rank holds all E experts'
gate/up rows and down columns for its slice, the router is replicated (every rank routes identically), and
the partial sums of the down projection are all-reduced once, as a row-parallel layer's are.
"""
from __future__ import annotations

import torch
from torch import nn

from blink import kernels
from blink.kernels import linear
from blink.kernels.moe import fused_moe, normed_block_takes, normed_block_triton
from blink.model.config import ModelConfig
from blink.model.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    _check_shape,
    _empty_param,
    _rank_size,
    _shard_size,
    read_all,
)


class Router(nn.Module):
    """HF's `mlp.gate`: one logit per expert, replicated on every rank."""

    def __init__(self, num_experts: int, hidden_size: int, device, dtype):
        super().__init__()
        self.weight = _empty_param(num_experts, hidden_size, device=device, dtype=dtype)


class FusedExperts(nn.Module):
    """All experts' weights stacked at load: w13 [E, 2 * I_local, H] (this rank's gate rows, then its up
    rows) and w2 [E, H, I_local]. HF stores them per expert (`experts.N.gate_proj.weight`, ...); the part
    `gate.N` / `up.N` / `down.N` names which one a checkpoint tensor fills."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, device, dtype, tp=None):
        super().__init__()
        self.tp_rank, self.tp_size = _rank_size(tp)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.local = _shard_size(intermediate_size, self.tp_size, "moe_intermediate_size")
        self.gemv_pairs = 0  # steps of up to this many (token, expert) pairs stream the weights (model/fusion.py)
        self.normed_block = True  # with them, one row folds the post-attention norm in (SparseMoeBlock.normed)
        self.w13 = _empty_param(num_experts, 2 * self.local, hidden_size, device=device, dtype=dtype)
        self.w2 = _empty_param(num_experts, hidden_size, self.local, device=device, dtype=dtype)

    def hf_parts(self, param_name: str) -> dict[str, tuple]:
        """part -> where that HF tensor sits in the one-rank (unsharded) parameter."""
        inter = self.intermediate_size
        if param_name == "w13":
            return {**{f"gate.{e}": (e, slice(0, inter)) for e in range(self.num_experts)},
                    **{f"up.{e}": (e, slice(inter, 2 * inter)) for e in range(self.num_experts)}}
        return {f"down.{e}": (e,) for e in range(self.num_experts)}

    def load_hf(self, param_name: str, hf_tensor, part: str | None) -> None:
        lo, hi = self.tp_rank * self.local, (self.tp_rank + 1) * self.local
        if part is None:  # transformers 5's stacked form: gate_up_proj [E, 2I, H] or down_proj [E, H, I]
            self._load_stacked(param_name, hf_tensor, lo, hi)
            return
        kind, _, index = part.partition(".")
        expert = int(index)
        if kind == "down":
            _check_shape(part, hf_tensor, (self.hidden_size, self.intermediate_size))
            self.w2[expert].copy_(hf_tensor[:, lo:hi])
            return
        _check_shape(part, hf_tensor, (self.intermediate_size, self.hidden_size))
        rows = slice(0, self.local) if kind == "gate" else slice(self.local, 2 * self.local)
        self.w13[expert, rows].copy_(read_all(hf_tensor[lo:hi]))


    def _load_stacked(self, param_name: str, hf_tensor, lo: int, hi: int) -> None:
        e, h, inter = self.num_experts, self.hidden_size, self.intermediate_size
        if param_name == "w2":
            _check_shape("down_proj", hf_tensor, (e, h, inter))
            self.w2.copy_(hf_tensor[:, :, lo:hi])
            return
        _check_shape("gate_up_proj", hf_tensor, (e, 2 * inter, h))
        self.w13[:, :self.local].copy_(hf_tensor[:, lo:hi])
        self.w13[:, self.local:].copy_(hf_tensor[:, inter + lo:inter + hi])


class SharedExpert(nn.Module):
    """Qwen2-MoE's shared expert: a gated MLP sharded like the dense one, whose down projection's partial
    sums join the routed experts' before the block's single all-reduce."""

    def __init__(self, cfg: ModelConfig, device, dtype, tp=None):
        super().__init__()
        size = cfg.shared_expert_intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, {"gate": size, "up": size}, False, device,
                                                 dtype, tp)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, False, device, dtype, tp)

    def partial(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's share of down(silu(gate) * up), not yet all-reduced."""
        return linear(self.gate_up_proj(hidden), self.down_proj.weight, None, silu_mul_input=True)


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, device, dtype, tp=None):
        super().__init__()
        self.tp = tp
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Router(cfg.num_experts, cfg.hidden_size, device, dtype)
        self.experts = FusedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, device, dtype,
                                    tp)
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = SharedExpert(cfg, device, dtype, tp)
            self.shared_expert_gate = Router(1, cfg.hidden_size, device, dtype)  # replicated [1, H]
        else:
            self.shared_expert = self.shared_expert_gate = None

    def takes_normed(self, hidden: torch.Tensor) -> bool:
        """Whether normed() runs this call: one row on the GPU with the streams on (BLINK_MOE_GEMV), no shared
        expert (it would need the normalized row apart). Shapes only, so graph-safe."""
        return (self.shared_expert is None and self.experts.normed_block and kernels._triton_device(hidden)
                and normed_block_takes(hidden, self.gate.weight, self.experts.w13, self.experts.w2, self.top_k,
                                       self.experts.gemv_pairs))

    def normed(self, hidden: torch.Tensor, norm, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's post-attention norm (residual add included) and this block in three launches (kernels/moe.py:
        normed_block_triton): (output, new residual)."""
        out, new_residual = normed_block_triton(hidden, residual, norm.weight, norm.eps, self.gate.weight,
                                                self.experts.w13, self.experts.w2, self.top_k, self.renormalize)
        return (out if self.tp is None or self.tp.size == 1 else self.tp.all_reduce(out)), new_residual

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        router_logits = linear(hidden, self.gate.weight)  # in the model dtype, as transformers does
        out = fused_moe(hidden, router_logits, self.experts.w13, self.experts.w2, self.top_k, self.renormalize,
                        self.experts.gemv_pairs)
        if self.shared_expert is not None:  # the sigmoid gate is replicated, so it may scale a partial sum
            gate = torch.sigmoid(linear(hidden, self.shared_expert_gate.weight))
            out = out + gate * self.shared_expert.partial(hidden)
        return out if self.tp is None or self.tp.size == 1 else self.tp.all_reduce(out)
