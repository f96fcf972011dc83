"""ModelConfig: the few numbers of a Llama-family decoder, read from an HF config.json.

Also Phi-3/Phi-4 (Llama's math with fused qkv_proj/gate_up_proj checkpoint tensors) and the mixtures of
experts: Qwen3-MoE (Qwen3's attention), Qwen2-MoE (Qwen2's, plus a gated shared expert) and Mixtral
(Mistral's); a routed mixture of experts replaces the MLP on their sparse layers.

Both config.json forms are understood: the classic one (`rope_theta`, `rope_scaling`, `torch_dtype`) and
transformers 5's (`rope_parameters`, `dtype`, `layer_types`). Anything that would change the math and is
not implemented is refused with a one-line ModelConfigError; fields that do not change it are ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)
_QWEN3_LIKE = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_NO_ATTENTION_BIAS = ("Phi3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelConfigError(ValueError):
    """The checkpoint needs something blink does not implement (or its config is malformed)."""


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # may differ from hidden_size // num_attention_heads and need not be a power of two
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None  # None = plain RoPE
    max_position_embeddings: int
    qkv_bias: bool  # Qwen2 always; Llama/Qwen3 with attention_bias
    o_proj_bias: bool  # Llama/Qwen3 with attention_bias
    mlp_bias: bool  # Llama with mlp_bias
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_word_embeddings: bool
    dtype: torch.dtype  # the checkpoint's dtype (what --dtype auto picks)
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    # Mixture of experts (num_experts == 0: every layer is a dense MLP).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalize the top-k routing weights to sum to 1
    decoder_sparse_step: int = 1  # every decoder_sparse_step-th layer is sparse ...
    mlp_only_layers: tuple[int, ...] = ()  # ... except these, which keep the dense MLP
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an always-on expert, gated by a sigmoid

    def is_moe_layer(self, layer: int) -> bool:
        """transformers' rule (Qwen3-MoE): sparse unless listed in mlp_only_layers or off the step."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf_dict(*_read_dir(Path(path)))

    @classmethod
    def from_hf_dict(cls, hf: dict, generation: dict | None = None) -> ModelConfig:
        """Parse an HF config.json dict (plus, optionally, its generation_config.json dict)."""
        architecture = _architecture(hf)
        _refuse_unimplemented(hf, architecture)
        hidden = _required(hf, "hidden_size")
        heads = _required(hf, "num_attention_heads")
        # Qwen3 defaults head_dim to 128 when absent; the others to hidden / heads.
        default_head_dim = 128 if architecture in _QWEN3_LIKE else hidden // heads
        # Phi-3, Mixtral and Qwen2-MoE build their attention without consulting attention_bias.
        attention_bias = bool(hf.get("attention_bias", False)) and architecture not in _NO_ATTENTION_BIAS
        theta, scaling = _rope(hf)
        eos = _eos(hf, generation)
        return cls(
            architecture=architecture,
            vocab_size=_required(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_required(hf, "intermediate_size"),
            num_hidden_layers=_required(hf, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or default_head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", _DEFAULT_MAX_POS[architecture])),
            qkv_bias=architecture == "Qwen2ForCausalLM" or attention_bias or (
                architecture == "Qwen2MoeForCausalLM" and bool(hf.get("qkv_bias", True))),
            o_proj_bias=attention_bias and architecture in ("LlamaForCausalLM", *_QWEN3_LIKE),
            mlp_bias=bool(hf.get("mlp_bias", False)) and architecture == "LlamaForCausalLM",
            qk_norm=architecture in _QWEN3_LIKE,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dtype=_dtype(hf),
            eos_token_ids=_token_ids(eos),
            bos_token_id=hf.get("bos_token_id"),
            **_moe_fields(hf, architecture),
        )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


_DEFAULT_MAX_POS = {
    "LlamaForCausalLM": 2048,
    "MistralForCausalLM": 4096 * 32,
    "MixtralForCausalLM": 4096 * 32,
    "Phi3ForCausalLM": 4096,
    "Qwen2ForCausalLM": 32768,
    "Qwen2MoeForCausalLM": 32768,
    "Qwen3ForCausalLM": 32768,
    "Qwen3MoeForCausalLM": 32768,
}


def _moe_fields(hf: dict, architecture: str) -> dict:
    if architecture not in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"):
        return {}
    # transformers 5 writes Qwen's num_experts back as num_local_experts (Mixtral's own name).
    experts = int(hf.get("num_experts", hf.get("num_local_experts", 0)) or 0)
    if experts == 0:
        return {}
    top_k = _required(hf, "num_experts_per_tok")
    if not 0 < top_k <= experts:
        raise ModelConfigError(f"num_experts_per_tok {top_k} must be in [1, num_experts={experts}]")
    if architecture == "MixtralForCausalLM":  # every layer sparse, experts as wide as the MLP, renormalized
        return {"num_experts": experts, "num_experts_per_tok": top_k,
                "moe_intermediate_size": _required(hf, "intermediate_size"), "norm_topk_prob": True}
    return {"num_experts": experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": _required(hf, "moe_intermediate_size"),
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
            "decoder_sparse_step": int(hf.get("decoder_sparse_step", 1)),
            "mlp_only_layers": tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
            "shared_expert_intermediate_size": int(hf.get("shared_expert_intermediate_size", 0) or 0)}


_ARCHITECTURE_OF_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def _architecture(hf: dict) -> str:
    architectures = hf.get("architectures") or []
    if not architectures and hf.get("model_type") in _ARCHITECTURE_OF_MODEL_TYPE:
        architectures = [_ARCHITECTURE_OF_MODEL_TYPE[hf["model_type"]]]  # configs saved without it
    if len(architectures) != 1:
        raise ModelConfigError(f"config.json must name exactly one architecture, got {architectures}")
    if architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise ModelConfigError(
            f"unsupported architecture {architectures[0]} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return architectures[0]


def _required(hf: dict, key: str) -> int:
    if key not in hf:
        raise ModelConfigError(f"config.json lacks {key}")
    return int(hf[key])


def _refuse_unimplemented(hf: dict, architecture: str) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"unsupported hidden_act {hf['hidden_act']!r} (only silu)")
    if hf.get("quantization_config"):
        raise ModelConfigError("quantized checkpoints are not supported")
    if architecture == "Qwen2MoeForCausalLM" and hf.get("use_sliding_window"):
        raise ModelConfigError("sliding window attention (use_sliding_window) is not supported")
    others = sorted({t for t in _layer_types(hf, architecture) if t != "full_attention"})
    if others:
        raise ModelConfigError(f"unsupported layer types {others} (only full_attention)")
    # Mistral has no use_sliding_window switch: a window is active whenever it is shorter than the
    # context (the engine never runs past max_position_embeddings).
    window = hf.get("sliding_window")
    max_pos = hf.get("max_position_embeddings", _DEFAULT_MAX_POS[architecture])
    windowed = ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
    if architecture in windowed and window is not None and window < max_pos:
        raise ModelConfigError(f"sliding window attention (sliding_window={window}) is not supported")


def _layer_types(hf: dict, architecture: str) -> list[str]:
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    # Qwen2/Qwen3 derive the layer types as transformers does: sliding from max_window_layers on.
    layers = int(hf.get("num_hidden_layers", 0))
    if architecture in ("Qwen2ForCausalLM", *_QWEN3_LIKE) and hf.get("use_sliding_window"):
        if hf.get("sliding_window") is not None:
            first_sliding = int(hf.get("max_window_layers", 28))
            return ["sliding_attention" if i >= first_sliding else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from either `rope_parameters` (transformers 5) or `rope_theta`+`rope_scaling`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ModelConfigError("partial rotary embeddings (partial_rotary_factor != 1) are not supported")
    if rope_type in ("longrope", "su"):  # Phi-3.5 / Phi-4-mini's long-context scaling
        raise ModelConfigError(f"rope scaling {rope_type!r} (Phi-3 long context) is not supported; "
                               "use a checkpoint with default RoPE (e.g. Phi-4)")
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ModelConfigError(f"unsupported rope type {rope_type!r} (supported: default, llama3)")
    try:
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ModelConfigError(f"llama3 rope scaling lacks {e.args[0]}") from None
    return theta, scaling


def _dtype(hf: dict) -> torch.dtype:
    name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise ModelConfigError(f"unsupported checkpoint dtype {name!r} (supported: {', '.join(DTYPES)})")
    return DTYPES[name]


def _read_dir(path: Path) -> tuple[dict, dict]:
    """A model dir's config.json and generation_config.json (empty when absent)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelConfigError(f"{path} has no config.json")
    generation_file = path / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    return json.loads(config_file.read_text()), generation


def _eos(hf: dict, generation: dict | None) -> object:
    return (generation or {}).get("eos_token_id", hf.get("eos_token_id"))


def eos_token_ids_of_dir(path: str | Path) -> tuple[int, ...]:
    """The EOS ids alone, as ModelConfig reads them, without the rest of the config: the front end needs only
    these (structured outputs' grammars end on them), and a tokenizer-only dir names no architecture."""
    return _token_ids(_eos(*_read_dir(Path(path))))


def _token_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
