"""Named model configs with real shapes, filled with random weights: benchmarks need no checkpoint.

Each preset is written as the model's HF config.json (trimmed to what matters) and parsed by the same code
as a real checkpoint. Presets have no tokenizer: the engine is driven with token ids.
"""
from __future__ import annotations

import torch

from blink.model.config import ModelConfig

_LLAMA3_SCALING = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
_QWEN_EOS = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "vocab_size": 151936,
             "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}
_LLAMA3_COMMON = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "rms_norm_eps": 1e-5,
                  "rope_theta": 500000.0, "max_position_embeddings": 131072, "bos_token_id": 128000,
                  "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"}

PRESETS: dict[str, dict] = {
    # Llama 3.1 8B
    "llama3-8b": {**_LLAMA3_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8,
                  "rope_scaling": {**_LLAMA3_SCALING, "factor": 8.0}},
    "llama3.2-1b": {**_LLAMA3_COMMON, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                    "tie_word_embeddings": True, "rope_scaling": {**_LLAMA3_SCALING, "factor": 32.0}},
    "qwen3-8b": {**_QWEN_EOS, "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
                 "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
                 "max_position_embeddings": 40960},
    "qwen3-32b": {**_QWEN_EOS, "architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120,
                  "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
                  "max_position_embeddings": 40960},
    "qwen2.5-7b": {**_QWEN_EOS, "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064,
                   "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "rope_theta": 1000000.0,
                   "max_position_embeddings": 32768, "use_sliding_window": False},
    # Mistral 7B v0.3 (no sliding window)
    "mistral-7b": {"architectures": ["MistralForCausalLM"], "vocab_size": 32768, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                   "max_position_embeddings": 32768, "sliding_window": None, "bos_token_id": 1,
                   "eos_token_id": 2, "torch_dtype": "bfloat16"},
    # Phi-4 (14.7B): Llama's math, fused qkv/gate_up in the checkpoint, default RoPE, no sliding window.
    "phi-4": {"architectures": ["Phi3ForCausalLM"], "vocab_size": 100352, "hidden_size": 5120,
              "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40,
              "num_key_value_heads": 10, "rms_norm_eps": 1e-5, "rope_theta": 250000.0,
              "max_position_embeddings": 16384, "sliding_window": None, "bos_token_id": 100257,
              "eos_token_id": 100265, "torch_dtype": "bfloat16"},
    # Qwen3-30B-A3B: 128 experts of width 768, 8 routed per token, on all 48 layers.
    "qwen3-30b-a3b": {**_QWEN_EOS, "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "mlp_only_layers": [], "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0,
                      "max_position_embeddings": 40960},
    # Tiny shapes for tests and CPU runs.
    "tiny-llama": {"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64,
                   "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "max_position_embeddings": 1024, "eos_token_id": 2,
                   "bos_token_id": 1, "rope_theta": 10000.0, "torch_dtype": "float32"},
    # tiny-llama with 4k positions: the device self-test's prompts behind a 2,000-token shared prefix
    "tiny-llama-4k": {"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64,
                      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "max_position_embeddings": 4096, "eos_token_id": 2,
                      "bos_token_id": 1, "rope_theta": 10000.0, "torch_dtype": "float32"},
    "tiny-qwen3": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
                   "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 48, "max_position_embeddings": 1024,
                   "eos_token_id": 2, "rope_theta": 1000000.0, "torch_dtype": "float32"},
    "tiny-qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 512, "hidden_size": 64,
                       "intermediate_size": 128, "moe_intermediate_size": 48, "num_experts": 8,
                       "num_experts_per_tok": 2, "norm_topk_prob": True, "mlp_only_layers": [0],
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "head_dim": 16, "max_position_embeddings": 1024, "eos_token_id": 2,
                       "rope_theta": 1000000.0, "torch_dtype": "float32"},
    "tiny-qwen2": {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
                   "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "tie_word_embeddings": True, "max_position_embeddings": 1024,
                   "eos_token_id": 2, "rope_theta": 1000000.0, "torch_dtype": "float32"},
}


def get(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r} (presets: {', '.join(PRESETS)})")
    return ModelConfig.from_hf_dict(PRESETS[name])


def config_for(model: str | None) -> ModelConfig:
    """--model's config without loading weights: a preset's, a model dir's, or (None) the demo model's."""
    from pathlib import Path

    from blink.model.demo import ensure_default_model

    source = model or str(ensure_default_model())
    return get(source) if source in PRESETS else ModelConfig.from_dir(Path(source))


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Fill every parameter in place on its own device: norm weights 1, everything else N(0, std)."""
    generator = None
    for name, param in model.named_parameters():
        if generator is None:
            generator = torch.Generator(device=param.device).manual_seed(seed)
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=generator)
