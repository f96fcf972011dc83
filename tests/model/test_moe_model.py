"""Qwen3-MoE and Phi-3 in blink's model: which layers are sparse, experts stacked from their HF names (and
sharded on the intermediate dimension), Phi-3's fused checkpoint tensors, and the Triton MoE path."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file

from blink.kernels import moe as moe_kernels
from blink.model import moe, presets
from blink.model.config import ModelConfig
from blink.model.llama import LlamaForCausalLM, LlamaMLP
from blink.model.weights import WeightLoadError, load_hf_tensors, load_model
from tests.hf_models import make_tiny_model
from tests.model.paged import PagedDriver


@dataclass
class RankOnly:
    """Enough of a TPGroup to build and load a shard (loading runs no collective)."""

    rank: int
    size: int


def _tensors(path):
    return load_file(str(path / "model.safetensors"))


def test_sparse_layers_follow_step_and_mlp_only_layers(tmp_path):
    model, cfg = load_model(make_tiny_model(tmp_path, "qwen3_moe"), "cpu")  # 3 layers, mlp_only_layers [1]
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [moe.SparseMoeBlock, LlamaMLP, moe.SparseMoeBlock]
    step2 = ModelConfig.from_hf_dict({**_hf_config(tmp_path), "decoder_sparse_step": 2, "mlp_only_layers": []})
    assert [step2.is_moe_layer(i) for i in range(3)] == [False, True, False]
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)


def _hf_config(tmp_path):
    import json

    return json.loads((tmp_path / "tiny-qwen3_moe-0" / "config.json").read_text())


@pytest.mark.parametrize("rank", [0, 1])
def test_experts_are_stacked_and_sharded_from_hf_names(tmp_path, rank):
    path = make_tiny_model(tmp_path, "qwen3_moe")
    cfg = ModelConfig.from_dir(path)
    shard = LlamaForCausalLM(cfg, "cpu", torch.float32, RankOnly(rank, 2))
    hf = _tensors(path)
    load_hf_tensors(shard, hf.items())
    experts = shard.model.layers[2].mlp.experts
    local = cfg.moe_intermediate_size // 2
    cols = slice(rank * local, (rank + 1) * local)
    for e in range(cfg.num_experts):
        prefix = f"model.layers.2.mlp.experts.{e}"
        torch.testing.assert_close(experts.w13[e, :local], hf[f"{prefix}.gate_proj.weight"][cols], rtol=0, atol=0)
        torch.testing.assert_close(experts.w13[e, local:], hf[f"{prefix}.up_proj.weight"][cols], rtol=0, atol=0)
        torch.testing.assert_close(experts.w2[e], hf[f"{prefix}.down_proj.weight"][:, cols], rtol=0, atol=0)
    assert torch.equal(shard.model.layers[2].mlp.gate.weight, hf["model.layers.2.mlp.gate.weight"])  # replicated


def test_missing_or_misshapen_expert_is_named(tmp_path):
    path = make_tiny_model(tmp_path, "qwen3_moe")
    cfg = ModelConfig.from_dir(path)
    hf = _tensors(path)
    missing = {k: v for k, v in hf.items() if k != "model.layers.0.mlp.experts.5.up_proj.weight"}
    with pytest.raises(WeightLoadError, match=r"lacks 1 tensor\(s\): model.layers.0.mlp.experts.5.up_proj.weight"):
        load_hf_tensors(LlamaForCausalLM(cfg, "cpu", torch.float32), missing.items())
    bad = {**hf, "model.layers.0.mlp.experts.5.down_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(WeightLoadError, match="experts.5.down_proj.weight: down.5"):
        load_hf_tensors(LlamaForCausalLM(cfg, "cpu", torch.float32), bad.items())
    extra = {**hf, "model.layers.1.mlp.experts.0.gate_proj.weight": torch.zeros(32, 64)}  # layer 1 is dense
    with pytest.raises(WeightLoadError, match="unexpected tensor model.layers.1.mlp.experts.0"):
        load_hf_tensors(LlamaForCausalLM(cfg, "cpu", torch.float32), extra.items())


def test_phi3_fused_tensors_fill_every_part_and_split_q_k_v_load_too(tmp_path):
    path = make_tiny_model(tmp_path, "phi3")
    cfg = ModelConfig.from_dir(path)
    hf = _tensors(path)
    assert "model.layers.0.self_attn.qkv_proj.weight" in hf and "model.layers.0.mlp.gate_up_proj.weight" in hf
    fused, _ = load_model(path, "cpu")
    # The same weights as separate q/k/v and gate/up tensors (the Llama layout) give the same model.
    split = {}
    for name, tensor in hf.items():
        if name.endswith("qkv_proj.weight"):
            q, k, v = tensor.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
            split |= {name.replace("qkv_proj", p): t for p, t in (("q_proj", q), ("k_proj", k), ("v_proj", v))}
        elif name.endswith("gate_up_proj.weight"):
            gate, up = tensor.chunk(2)
            split |= {name.replace("gate_up_proj", "gate_proj"): gate, name.replace("gate_up_proj", "up_proj"): up}
        else:
            split[name] = tensor
    other = LlamaForCausalLM(cfg, "cpu", torch.float32)
    load_hf_tensors(other, split.items())
    for (name, a), (_, b) in zip(fused.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    shard = LlamaForCausalLM(cfg, "cpu", torch.float32, RankOnly(1, 2))  # rank 1's rows of the fused tensor
    load_hf_tensors(shard, hf.items())
    qkv = shard.model.layers[0].self_attn.qkv_proj
    half_q = cfg.q_size // 2
    torch.testing.assert_close(qkv.weight[qkv.part_slices["q"]],
                               hf["model.layers.0.self_attn.qkv_proj.weight"][half_q:cfg.q_size], rtol=0, atol=0)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs the Triton interpreter or a GPU")
def test_triton_moe_path_matches_reference(monkeypatch):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_model("tiny-qwen3-moe", device, dtype=torch.float32, seed=1)
    chunks = [{0: [1, 2, 3, 4, 5], 1: [6]}, {0: [7], 1: [8, 9]}]
    reference = PagedDriver(model)
    monkeypatch.setattr(moe, "fused_moe", moe_kernels.fused_moe_ref)
    expected = [reference.step(c, pad_tokens=2, pad_seqs=1) for c in chunks]
    monkeypatch.setattr(moe, "fused_moe", moe_kernels.fused_moe_triton)
    triton_driver = PagedDriver(model)
    for step, c in enumerate(chunks):
        got = triton_driver.step(c, pad_tokens=2, pad_seqs=1)
        for seq in c:
            torch.testing.assert_close(got[seq], expected[step][seq], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rank", [None, 1])
def test_transformers5_stacked_experts_load_like_the_checkpoint(tmp_path, rank):
    """HF's in-memory state_dict holds experts stacked (experts.gate_up_proj [E, 2I, H]); it loads into
    the same weights as the per-expert checkpoint, whole or as rank 1's shard."""
    from tests.hf_models import load_hf_model

    path = make_tiny_model(tmp_path, "qwen3_moe")
    cfg = ModelConfig.from_dir(path)
    state = load_hf_model(path).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    tp = None if rank is None else RankOnly(rank, 2)
    from_state, from_files = (LlamaForCausalLM(cfg, "cpu", torch.float32, tp) for _ in range(2))
    load_hf_tensors(from_state, state.items())
    load_hf_tensors(from_files, _tensors(path).items())
    for (name, a), (_, b) in zip(from_state.named_parameters(), from_files.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_mixtral_names_load_and_missing_ones_are_spelled_as_mixtral_does(tmp_path):
    path = make_tiny_model(tmp_path, "mixtral")
    cfg = ModelConfig.from_dir(path)
    hf = _tensors(path)
    assert "model.layers.0.block_sparse_moe.experts.1.w3.weight" in hf
    model = LlamaForCausalLM(cfg, "cpu", torch.float32)
    load_hf_tensors(model, hf.items())
    torch.testing.assert_close(model.model.layers[0].mlp.experts.w13[1, cfg.moe_intermediate_size:],
                               hf["model.layers.0.block_sparse_moe.experts.1.w3.weight"], rtol=0, atol=0)
    missing = {k: v for k, v in hf.items() if k != "model.layers.1.block_sparse_moe.experts.2.w2.weight"}
    with pytest.raises(WeightLoadError, match="lacks 1 tensor\\(s\\): model.layers.1.block_sparse_moe.experts.2.w2"):
        load_hf_tensors(LlamaForCausalLM(cfg, "cpu", torch.float32), missing.items())


def test_tp_size_must_split_the_experts_and_the_shared_expert():
    from blink.model.llama import check_tp_size

    moe_cfg = presets.get("tiny-qwen3-moe")  # experts 48 wide
    check_tp_size(moe_cfg, 4)
    with pytest.raises(ValueError, match="does not divide the experts' intermediate size 50"):
        check_tp_size(dataclasses.replace(moe_cfg, moe_intermediate_size=50), 4)
    with pytest.raises(ValueError, match="shared expert's intermediate size 30"):
        check_tp_size(dataclasses.replace(moe_cfg, shared_expert_intermediate_size=30), 4)
