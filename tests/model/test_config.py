"""ModelConfig: both config.json forms, defaults, eos sources, and every refusal."""
from __future__ import annotations

import json

import pytest
import torch

from blink.model.config import Llama3RopeScaling, ModelConfig, ModelConfigError

LLAMA31_CLASSIC = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": False,
    "pretraining_tp": 1, "use_cache": True, "attention_dropout": 0.0, "initializer_range": 0.02,
}
QWEN3_T5 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 48, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "layer_types": ["full_attention"] * 3, "sliding_window": None, "use_sliding_window": False,
    "max_window_layers": 3, "tie_word_embeddings": True, "eos_token_id": 151645,
}


def write_dir(tmp_path, config: dict, generation: dict | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_classic_form_with_llama3_scaling(tmp_path):
    cfg = ModelConfig.from_dir(write_dir(tmp_path, LLAMA31_CLASSIC))
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta) == (16, 2, 500000.0)
    assert cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    assert cfg.dtype == torch.bfloat16 and cfg.rms_norm_eps == 1e-5
    assert cfg.eos_token_ids == (128001,) and cfg.bos_token_id == 128000
    assert not (cfg.qkv_bias or cfg.o_proj_bias or cfg.mlp_bias or cfg.qk_norm or cfg.tie_word_embeddings)


def test_legacy_rope_scaling_type_key():
    hf = {**LLAMA31_CLASSIC, "rope_scaling": {**LLAMA31_CLASSIC["rope_scaling"]}}
    hf["rope_scaling"]["type"] = hf["rope_scaling"].pop("rope_type")
    assert ModelConfig.from_hf_dict(hf).rope_scaling.factor == 8.0


def test_transformers5_form(tmp_path):
    cfg = ModelConfig.from_dir(write_dir(tmp_path, QWEN3_T5, {"eos_token_id": [151645, 151643]}))
    assert cfg.qk_norm and cfg.head_dim == 48 and cfg.tie_word_embeddings
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None and cfg.dtype == torch.bfloat16
    assert cfg.eos_token_ids == (151645, 151643)  # generation_config.json wins over config.json
    assert (cfg.q_size, cfg.kv_size) == (192, 96)


def test_transformers5_llama3_rope_parameters():
    hf = {k: v for k, v in LLAMA31_CLASSIC.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    hf["rope_parameters"] = {**LLAMA31_CLASSIC["rope_scaling"], "rope_theta": 500000.0}
    hf["dtype"] = "bfloat16"
    assert ModelConfig.from_hf_dict(hf) == ModelConfig.from_hf_dict(LLAMA31_CLASSIC)


def test_family_defaults():
    base = {k: v for k, v in QWEN3_T5.items() if k not in ("head_dim", "dtype", "rope_parameters")}
    qwen3 = ModelConfig.from_hf_dict(base)
    assert qwen3.head_dim == 128 and qwen3.dtype == torch.float32 and qwen3.rope_theta == 10000.0
    qwen2 = ModelConfig.from_hf_dict({**base, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.head_dim == 16 and qwen2.qkv_bias and not qwen2.o_proj_bias and not qwen2.qk_norm
    llama = ModelConfig.from_hf_dict({**LLAMA31_CLASSIC, "attention_bias": True, "mlp_bias": True})
    assert llama.qkv_bias and llama.o_proj_bias and llama.mlp_bias
    bare = {k: v for k, v in base.items() if k not in ("eos_token_id", "architectures")}
    no_eos = ModelConfig.from_hf_dict(bare)
    assert no_eos.architecture == "Qwen3ForCausalLM"  # from model_type
    assert no_eos.eos_token_ids == () and no_eos.num_key_value_heads == 2


@pytest.mark.parametrize("harmless", [
    {"use_sliding_window": False, "sliding_window": 4096},  # Qwen2/3: the window is off
    {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 3},  # no layer past 3
    {"layer_types": ["full_attention"] * 3, "rope_scaling": None, "attention_dropout": 0.1},
    {"hidden_act": "silu", "pad_token_id": 7, "use_cache": False, "initializer_range": 1.0},
])
def test_fields_that_do_not_change_the_math_are_accepted(harmless):
    hf = {**QWEN3_T5, **harmless}
    if "layer_types" not in harmless:
        hf.pop("layer_types")
    ModelConfig.from_hf_dict(hf)


def test_mistral_window_not_shorter_than_the_context_is_accepted():
    hf = {**LLAMA31_CLASSIC, "architectures": ["MistralForCausalLM"], "rope_scaling": None,
          "max_position_embeddings": 4096, "sliding_window": 4096}
    assert ModelConfig.from_hf_dict(hf).architecture == "MistralForCausalLM"


PHI4 = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 100352, "hidden_size": 5120,
    "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 10,
    "max_position_embeddings": 16384, "original_max_position_embeddings": 16384, "rope_theta": 250000,
    "rope_scaling": None, "sliding_window": None, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "pad_token_id": 100349, "eos_token_id": 100265,
}
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rope_scaling": None, "sliding_window": None,
    "use_sliding_window": False, "max_window_layers": 48, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "torch_dtype": "bfloat16",
}


def test_phi4_config():
    cfg = ModelConfig.from_hf_dict(PHI4)
    assert cfg.architecture == "Phi3ForCausalLM" and cfg.head_dim == 128 and cfg.rope_theta == 250000.0
    assert not (cfg.qkv_bias or cfg.o_proj_bias or cfg.mlp_bias or cfg.qk_norm) and cfg.num_experts == 0
    assert ModelConfig.from_hf_dict({k: v for k, v in PHI4.items() if k != "architectures"}) == cfg
    assert ModelConfig.from_hf_dict({**PHI4, "attention_bias": True}) == cfg  # Phi-3 ignores it, as HF does


def test_qwen3_moe_config():
    cfg = ModelConfig.from_hf_dict(QWEN3_MOE)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    assert cfg.norm_topk_prob and cfg.qk_norm and all(cfg.is_moe_layer(i) for i in range(48))
    # transformers 5 saves num_experts as num_local_experts.
    resaved = {k: v for k, v in QWEN3_MOE.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert ModelConfig.from_hf_dict(resaved) == cfg
    mixed = ModelConfig.from_hf_dict({**QWEN3_MOE, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert [mixed.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    dense = ModelConfig.from_hf_dict({**QWEN3_MOE, "num_experts": 0})
    assert not any(dense.is_moe_layer(i) for i in range(48))


def test_qwen2_moe_and_mixtral_configs():
    qwen2 = ModelConfig.from_hf_dict({**QWEN3_MOE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 60,
                                      "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                                      "shared_expert_intermediate_size": 5632, "norm_topk_prob": False})
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.shared_expert_intermediate_size == 5632
    assert qwen2.head_dim == 128 and not qwen2.norm_topk_prob
    mixtral = ModelConfig.from_hf_dict({**LLAMA31_CLASSIC, "architectures": ["MixtralForCausalLM"],
                                        "rope_scaling": None, "num_local_experts": 8, "num_experts_per_tok": 2,
                                        "intermediate_size": 14336, "sliding_window": None})
    assert (mixtral.num_experts, mixtral.moe_intermediate_size, mixtral.norm_topk_prob) == (8, 14336, True)
    assert all(mixtral.is_moe_layer(i) for i in range(2)) and not mixtral.shared_expert_intermediate_size


def _without_layer_types(hf: dict) -> dict:
    return {k: v for k, v in hf.items() if k != "layer_types"}


REFUSALS = {
    "architecture": ({**QWEN3_T5, "architectures": ["GemmaForCausalLM"]}, "unsupported architecture"),
    "no architecture": ({**QWEN3_T5, "architectures": [], "model_type": "gemma"}, "exactly one architecture"),
    "yarn": ({**QWEN3_T5, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
             "unsupported rope type 'yarn'"),
    "dynamic": ({**LLAMA31_CLASSIC, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    "longrope": ({**LLAMA31_CLASSIC, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope'"),
    "linear": ({**LLAMA31_CLASSIC, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "'linear'"),
    "llama3 incomplete": ({**LLAMA31_CLASSIC, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                          "lacks low_freq_factor"),
    "partial rotary": ({**QWEN3_T5, "partial_rotary_factor": 0.5}, "partial rotary"),
    "sliding layer type": ({**QWEN3_T5, "layer_types": ["full_attention", "sliding_attention"] * 2},
                           "unsupported layer types ['sliding_attention']"),
    "qwen sliding window": ({**_without_layer_types(QWEN3_T5), "use_sliding_window": True,
                             "sliding_window": 4096, "max_window_layers": 1}, "sliding_attention"),
    "mistral sliding window": ({**LLAMA31_CLASSIC, "architectures": ["MistralForCausalLM"],
                                "rope_scaling": None, "max_position_embeddings": 32768,
                                "sliding_window": 4096}, "sliding window"),
    "activation": ({**QWEN3_T5, "hidden_act": "gelu"}, "hidden_act"),
    "quantized": ({**QWEN3_T5, "quantization_config": {"quant_method": "awq"}}, "quantized"),
    "dtype": ({**QWEN3_T5, "dtype": "float8_e4m3fn"}, "unsupported checkpoint dtype"),
    "missing field": ({k: v for k, v in QWEN3_T5.items() if k != "hidden_size"}, "lacks hidden_size"),
    "phi3 longrope": ({**PHI4, "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 64,
                                                "long_factor": [2.0] * 64}}, "'longrope' \\(Phi-3 long context"),
    "phi3 su": ({**PHI4, "rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [1.0]}}, "'su'"),
    "phi3 partial rotary": ({**PHI4, "partial_rotary_factor": 0.75}, "partial rotary"),
    "phi3 sliding window": ({**PHI4, "sliding_window": 2047}, "sliding window"),
    "moe top-k": ({**QWEN3_MOE, "num_experts_per_tok": 129}, "num_experts_per_tok 129"),
    "qwen2-moe sliding": ({**QWEN3_MOE, "architectures": ["Qwen2MoeForCausalLM"], "use_sliding_window": True},
                          "use_sliding_window"),
    "moe width": ({k: v for k, v in QWEN3_MOE.items() if k != "moe_intermediate_size"},
                  "lacks moe_intermediate_size"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals(case):
    hf, message = REFUSALS[case]
    with pytest.raises(ModelConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        ModelConfig.from_hf_dict(hf)
    assert "\n" not in str(info.value)


def test_missing_config_json(tmp_path):
    with pytest.raises(ModelConfigError, match="no config.json"):
        ModelConfig.from_dir(tmp_path)
