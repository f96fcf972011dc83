"""Tiny random HF checkpoints for tests: real transformers models saved with save_pretrained.

`make_tiny_model(tmp_path, "qwen3", head_dim=48)` writes config.json, generation_config.json, safetensors
weights and the demo tokenizer (tokenizer.json + tokenizer_config.json with a chat template) into a fresh
directory and returns it. Weights are re-drawn with a seed and larger than HF's default init (norms and
biases too) so that a wrong norm, bias or rotation changes the logits visibly.
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers

from blink.model.demo import BOS, EOS, EOT, build_tokenizer, write_tokenizer_files

FAMILIES = {
    # family: (config class, model class, family-specific defaults)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),  # HF's default is 128
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": None}),
    # 8 experts of width 32, 2 per token; layer 1 of 3 keeps its dense MLP (mlp_only_layers).
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"head_dim": 16, "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1]}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {"num_hidden_layers": 3, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 48, "mlp_only_layers": [1]}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": None}),
}
TINY_SHAPES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}


def make_tiny_model(tmp_path: str | Path, family: str, *, seed: int = 0, max_shard_size: str | None = None,
                    **config_overrides) -> Path:
    """Build, randomize and save a tiny `family` model (a key of FAMILIES); returns its dir."""
    config_class, model_class, family_defaults = FAMILIES[family]
    out_dir = Path(tmp_path) / f"tiny-{family}-{seed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = write_tokenizer_files(tokenizer, out_dir, model_max_length=TINY_SHAPES["max_position_embeddings"])
    settings = {
        **TINY_SHAPES,
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": ids[BOS],
        "eos_token_id": [ids[EOT], ids[EOS]],
        **family_defaults,
        **config_overrides,
    }
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).to(torch.float32).eval()
    randomize_weights(model, seed)
    save_args = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **save_args)
    return out_dir


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int, std: float = 0.1) -> None:
    """Norm weights uniform in [0.75, 1.25], everything else N(0, std), drawn on the parameters' device."""
    generator = None
    for name, param in model.named_parameters():
        generator = generator or torch.Generator(device=param.device).manual_seed(seed)
        if name.endswith("norm.weight"):
            param.uniform_(0.75, 1.25, generator=generator)
        else:
            param.normal_(0.0, std, generator=generator)


def load_hf_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The transformers model saved at `path` (eager attention: the reference for logits)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager"
    ).to(device).eval()
