"""Weight loading: config forms, dtypes, tied embeddings, the fused-name mapping and its errors."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from blink.model.config import ModelConfig, ModelConfigError
from blink.model.weights import (
    FUSED_PROJECTIONS,
    WeightLoadError,
    load_model,
    to_blink_name,
    to_hf_name,
)
from tests.hf_models import make_tiny_model
from tests.model.paged import compare_dir_with_hf


def test_name_mapping_round_trips():
    for hf_module, (fused, part) in FUSED_PROJECTIONS.items():
        hf_name = f"model.layers.3.{hf_module}.weight"
        assert to_blink_name(hf_name) == (f"model.layers.3.{fused}.weight", part)
        assert to_hf_name(*to_blink_name(hf_name)) == hf_name
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    assert to_blink_name(o_proj) == (o_proj, None)


def test_classic_config_form_loads_the_same(tmp_path):
    """A hand-written classic config.json (rope_theta, rope_scaling llama3, torch_dtype) is read exactly
    like the transformers-5 form that save_pretrained wrote, and still matches HF's logits."""
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    model_dir = make_tiny_model(tmp_path, "llama", rope_parameters=rope)
    t5_cfg = ModelConfig.from_dir(model_dir)
    hf = json.loads((model_dir / "config.json").read_text())
    assert "rope_parameters" in hf and "dtype" in hf
    params = hf.pop("rope_parameters")
    hf["rope_theta"] = params.pop("rope_theta")
    hf["rope_scaling"] = {**params, "type": params.pop("rope_type")}
    hf["torch_dtype"] = hf.pop("dtype")
    (model_dir / "config.json").write_text(json.dumps(hf))
    assert ModelConfig.from_dir(model_dir) == t5_cfg
    assert t5_cfg.rope_scaling is not None
    compare_dir_with_hf(model_dir)


def test_dtype_auto_is_the_checkpoint_dtype(tmp_path):
    model_dir = make_tiny_model(tmp_path, "qwen2", tie_word_embeddings=True)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    model, cfg = load_model(model_dir, "cpu")
    assert cfg.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    model32, _ = load_model(model_dir, "cpu", dtype="float32")
    assert all(p.dtype == torch.float32 for p in model32.parameters())
    hf_embed = load_file(str(model_dir / "model.safetensors"))["model.embed_tokens.weight"]
    torch.testing.assert_close(model32.model.embed_tokens.weight, hf_embed, rtol=0, atol=0)
    torch.testing.assert_close(model.model.embed_tokens.weight, hf_embed.bfloat16(), rtol=0, atol=0)
    assert load_model(model_dir, "cpu", dtype=torch.float16)[0].lm_head.weight.dtype == torch.float16
    with pytest.raises(ModelConfigError, match="unsupported dtype"):
        load_model(model_dir, "cpu", dtype="int8")


def test_tied_embeddings_share_one_tensor(tmp_path):
    model_dir = make_tiny_model(tmp_path, "qwen2", tie_word_embeddings=True)
    tensors = load_file(str(model_dir / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    model, _ = load_model(model_dir, "cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # A tied checkpoint that repeats the embedding as lm_head.weight also loads.
    save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()},
              str(model_dir / "model.safetensors"))
    load_model(model_dir, "cpu")


def _rewrite_checkpoint(model_dir, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_rotary_inv_freq_is_ignored(tmp_path):
    model_dir = make_tiny_model(tmp_path, "llama")
    _rewrite_checkpoint(model_dir, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq":
                                                       torch.ones(8)}))
    load_model(model_dir, "cpu")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"),
     "lacks 1 tensor.*model.layers.1.self_attn.k_proj.weight"),
    (lambda t: t.pop("lm_head.weight"), "lacks 1 tensor.*lm_head.weight"),
    (lambda t: [t.pop(k) for k in list(t) if k.startswith("model.layers.0.")],
     r"lacks 9 tensor.* and 4 more"),
    (lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.ones(2)}), "unexpected tensor"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.ones(64)}), "unexpected tensor"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.ones(127, 64)}),
     r"up_proj.weight: .*shape \(127, 64\)"),
    (lambda t: t.update({"model.norm.weight": torch.ones(63)}), r"model.norm.weight: .*shape \(63,\)"),
    (lambda t: t.update({"model.layers.1.mlp.down_proj.weight": torch.ones(64, 64)}), "down_proj.weight"),
])
def test_checkpoint_errors(tmp_path, edit, message):
    model_dir = make_tiny_model(tmp_path, "llama")
    _rewrite_checkpoint(model_dir, edit)
    with pytest.raises(WeightLoadError, match=message):
        load_model(model_dir, "cpu")


def test_no_safetensors_and_unknown_names(tmp_path):
    model_dir = make_tiny_model(tmp_path, "llama")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(WeightLoadError, match="no \\*.safetensors"):
        load_model(model_dir, "cpu")
    with pytest.raises(ModelConfigError, match="neither a model directory nor a preset"):
        load_model(tmp_path / "nothing-here", "cpu")
