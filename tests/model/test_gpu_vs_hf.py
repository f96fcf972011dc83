"""GPU: few-layer models with real 8B shapes in bf16 (Triton kernels) vs HF transformers."""
from __future__ import annotations

import pytest
import torch
import transformers

from blink.model import presets
from blink.model.config import ModelConfig
from blink.model.llama import LlamaForCausalLM
from blink.model.weights import load_hf_tensors
from tests.hf_models import randomize_weights
from tests.model.paged import compare_with_hf


@pytest.mark.gpu
# phi-4 and qwen3-30b-a3b (issue 20): Phi-3's fused checkpoint, Qwen3-MoE's stacked experts as HF holds them.
@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-8b", "phi-4", "qwen3-30b-a3b"])
def test_real_shapes_bf16_match_transformers(name):
    hf_dict = {**presets.PRESETS[name], "num_hidden_layers": 2}
    architecture = hf_dict["architectures"][0]
    hf_config = getattr(transformers, architecture.replace("ForCausalLM", "Config"))(**hf_dict)
    with torch.device("cuda"):
        hf_model = getattr(transformers, architecture)(hf_config).to(torch.bfloat16).eval()
    randomize_weights(hf_model, seed=0, std=0.02)
    cfg = ModelConfig.from_hf_dict(hf_dict)
    model = LlamaForCausalLM(cfg, "cuda", torch.bfloat16, max_positions=4096)
    load_hf_tensors(model, hf_model.state_dict().items())
    # Prompts of 151, 1 and 300 tokens in one step, then mixed/decode steps over 16-token blocks.
    compare_with_hf(model, hf_model, rtol=None, max_prompt=300, block_size=16)


@pytest.mark.gpu
def test_real_shapes_at_128_token_blocks_match_transformers():
    """`--block-size 128`: a block over the 64-key tiles and one a 128-key tile (one table entry); session 34's GPU
    found the first failing to compile with the page gather on (tests/kernels/test_compile_sm90.py pins that)."""
    hf_dict = {**presets.PRESETS["llama3-8b"], "num_hidden_layers": 2}
    hf_config = transformers.LlamaConfig(**hf_dict)
    with torch.device("cuda"):
        hf_model = transformers.LlamaForCausalLM(hf_config).to(torch.bfloat16).eval()
    randomize_weights(hf_model, seed=0, std=0.02)
    model = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_dict), "cuda", torch.bfloat16, max_positions=4096)
    load_hf_tensors(model, hf_model.state_dict().items())
    compare_with_hf(model, hf_model, rtol=None, max_prompt=300, block_size=128)
