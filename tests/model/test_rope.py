"""RoPE tables vs transformers' rotary embedding (default and llama3 scaling)."""
from __future__ import annotations

import pytest
import torch
import transformers

from blink.model.config import ModelConfig
from blink.model.rope import rope_cos_sin

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("head_dim", [128, 80, 48])
def test_table_matches_transformers(rope, head_dim):
    hf_config = transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=32768,
        rope_parameters=ROPES[rope],
    )
    cfg = ModelConfig.from_hf_dict({**hf_config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    positions = torch.tensor([0, 1, 2, 17, 1000, 8191, 8192, 20000, 32767])
    table = rope_cos_sin(cfg, 32768)
    assert table.shape == (32768, head_dim) and table.dtype == torch.float32
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_config)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    half = head_dim // 2
    torch.testing.assert_close(table[positions, :half], cos[0, :, :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(table[positions, half:], sin[0, :, :half], rtol=0, atol=1e-6)
    # rotate_half convention: HF's cos/sin repeat the same half twice.
    torch.testing.assert_close(cos[0, :, :half], cos[0, :, half:])


def test_llama3_scaling_changes_low_frequencies_only():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 512,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4}
    plain = ModelConfig.from_hf_dict({**base, "rope_theta": 500000.0})
    scaled = ModelConfig.from_hf_dict({**base, "rope_parameters": ROPES["llama3"]})
    a, b = rope_cos_sin(plain, 10000), rope_cos_sin(scaled, 10000)
    assert torch.equal(a[:, :8], b[:, :8])  # the highest frequencies (cos) are kept
    sin_lowest = slice(128 - 8, 128)
    assert not torch.allclose(a[:, sin_lowest], b[:, sin_lowest], atol=1e-3)  # the lowest are divided
