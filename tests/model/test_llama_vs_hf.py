"""Whole-model logits through the paged path vs HF transformers, for tiny random models in fp32."""
from __future__ import annotations

import pytest
import torch

from blink.model.weights import load_model
from tests.hf_models import make_tiny_model
from tests.model.paged import PagedDriver, compare_dir_with_hf

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

CASES = {
    "llama": ("llama", {}),
    "llama-llama3-rope-biases": ("llama", {"rope_parameters": LLAMA3_ROPE, "attention_bias": True,
                                           "mlp_bias": True}),
    "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-head-dim-48": ("qwen3", {"head_dim": 48}),
    "qwen3-mha-bias": ("qwen3", {"num_key_value_heads": 4, "attention_bias": True}),
    "mistral": ("mistral", {}),
    "phi3-fused-checkpoint": ("phi3", {}),
    "phi3-gqa-untied": ("phi3", {"num_key_value_heads": 1, "rope_parameters": {"rope_type": "default",
                                                                               "rope_theta": 5000.0}}),
    "qwen3-moe": ("qwen3_moe", {}),
    # Every other layer sparse, raw top-k weights (no renormalization), 3 of 6 experts per token.
    "qwen3-moe-sparse-step-2": ("qwen3_moe", {"decoder_sparse_step": 2, "mlp_only_layers": [],
                                              "norm_topk_prob": False, "num_experts": 6,
                                              "num_experts_per_tok": 3}),
    "qwen2-moe-shared-expert": ("qwen2_moe", {}),
    "qwen2-moe-renormalized": ("qwen2_moe", {"norm_topk_prob": True, "decoder_sparse_step": 2,
                                             "mlp_only_layers": []}),
    "mixtral": ("mixtral", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    family, overrides = CASES[case]
    compare_dir_with_hf(make_tiny_model(tmp_path, family, **overrides))


def test_sharded_checkpoint_matches_transformers(tmp_path):
    model_dir = make_tiny_model(tmp_path, "qwen3", max_shard_size="100KB")
    assert (model_dir / "model.safetensors.index.json").is_file()
    assert len(list(model_dir.glob("*.safetensors"))) > 1
    compare_dir_with_hf(model_dir)


def test_padding_does_not_change_real_tokens(tmp_path):
    """The same tokens with and without padding tokens/sequences in the step give the same logits (up to
    the GEMM's blocking, which depends on the number of rows)."""
    model, cfg = load_model(make_tiny_model(tmp_path, "llama"), "cpu")
    chunks = {0: [5, 6, 7], 1: [8, 9]}
    plain = PagedDriver(model).step(chunks)
    padded = PagedDriver(model).step(chunks, pad_tokens=4, pad_seqs=2)
    for seq in chunks:
        torch.testing.assert_close(plain[seq], padded[seq], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "qwen3_moe"])
def test_bf16_matches_transformers_bf16(tmp_path, family):
    compare_dir_with_hf(make_tiny_model(tmp_path, family), rtol=None, dtype=torch.bfloat16)
