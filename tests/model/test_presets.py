"""Presets: real shapes (checked by parameter count against the published models) and random weights."""
from __future__ import annotations

import pytest
import torch

from blink.model import presets
from blink.model.llama import LlamaForCausalLM
from blink.model.weights import load_model
from tests.model.paged import PagedDriver

# Parameter counts of the published checkpoints these presets mirror.
PUBLISHED_PARAMETERS = {
    "llama3-8b": 8_030_261_248,
    "llama3.2-1b": 1_235_814_400,
    "qwen3-8b": 8_190_735_360,
    "qwen3-32b": 32_762_123_264,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_248_023_552,
    "phi-4": 14_659_507_200,
    "qwen3-30b-a3b": 30_532_122_624,
}


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMETERS))
def test_real_shapes(name):
    cfg = presets.get(name)
    model = LlamaForCausalLM(cfg, "meta", cfg.dtype, max_positions=16)  # shapes only, no memory
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[name]
    assert cfg.dtype == torch.bfloat16 and cfg.eos_token_ids


def test_every_preset_parses_and_unknown_is_refused():
    for name in presets.PRESETS:
        presets.get(name)
    assert presets.get("tiny-qwen3").head_dim == 48
    with pytest.raises(KeyError, match="unknown preset"):
        presets.get("llama-9000")


@pytest.mark.parametrize("name", [n for n in presets.PRESETS if n.startswith("tiny-")])
def test_tiny_presets_run_with_seeded_random_weights(name):
    model, cfg = load_model(name, "cpu", seed=3)
    same, _ = load_model(name, "cpu", seed=3)
    other, _ = load_model(name, "cpu", seed=4)
    weights = dict(model.named_parameters())
    assert all(torch.equal(p, weights[n]) for n, p in same.named_parameters())
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.all(model.model.norm.weight == 1)
    assert 0.015 < model.model.layers[0].mlp.down_proj.weight.std() < 0.025  # tiny-qwen3-moe: dense layer 0
    logits = PagedDriver(model).step({0: [1, 2, 3], 1: [4]})
    assert all(torch.isfinite(out).all() for out in logits.values())
