"""Loading weights by HF parameter names, and `load_model` (a checkpoint dir or a preset name).

Tensors are read one at a time from the safetensors files and copied straight into the model's
parameters, which already live on the target device in the target dtype (copy_ casts and moves), so no
second copy of the model is ever held. With tensor parallelism each rank reads only its own rows or
columns of a sharded tensor (safetensors slices: the layers' load_hf index them), never the whole of it.
Names are HF's, except for the projections blink fuses into one GEMM (FUSED_PROJECTIONS below) and the
MoE experts, which HF stores one by one (`mlp.experts.N.gate_proj.weight`) and blink stacks into
`mlp.experts.w13` / `mlp.experts.w2` at load (part `gate.N`, `up.N`, `down.N`). A checkpoint that is
already fused (Phi-3's `qkv_proj`, `gate_up_proj`) fills every part of the fused weight at once.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from blink.model import presets
from blink.model.config import DTYPES, ModelConfig, ModelConfigError
from blink.model.layers import ColumnParallelLinear, read_all, source_shape
from blink.model.llama import LlamaForCausalLM
from blink.model.moe import FusedExperts

# HF module (inside model.layers.N) -> (blink module it is fused into, its part there). The part names the
# output rows it occupies: see ColumnParallelLinear.part_slices.
FUSED_PROJECTIONS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up"),
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", "gate"),  # Qwen2-MoE
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", "up"),
}
_UNFUSED_PROJECTIONS = {target: hf for hf, target in FUSED_PROJECTIONS.items()}
_HF_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_EXPERT_PART = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_BLINK_EXPERTS = re.compile(r"^(.*\.experts)\.(w13|w2)$")
# transformers 5 holds the experts stacked in memory (its state_dict; save_pretrained unstacks them).
_HF_STACKED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")


class WeightLoadError(ValueError):
    """The checkpoint's tensors do not fit the model its config describes."""


def to_blink_name(hf_name: str) -> tuple[str, str | None]:
    """HF parameter name -> (blink parameter name, part of a fused projection or None)."""
    hf_name = hf_name.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's name for the MoE block
    expert = _HF_EXPERT.match(hf_name)
    if expert:
        prefix, index, kind = expert.groups()
        kind = _EXPERT_PART[kind]
        return f"{prefix}.{'w2' if kind == 'down' else 'w13'}", f"{kind}.{index}"
    stacked = _HF_STACKED.match(hf_name)
    if stacked:
        return f"{stacked.group(1)}.{'w13' if stacked.group(2) == 'gate_up_proj' else 'w2'}", None
    module, _, param = hf_name.rpartition(".")
    for hf_suffix, (fused, part) in FUSED_PROJECTIONS.items():
        if module.endswith("." + hf_suffix):
            return f"{module[: -len(hf_suffix)]}{fused}.{param}", part
    return hf_name, None


def to_hf_name(blink_name: str, part: str | None) -> str:
    if part is None:
        return blink_name
    experts = _BLINK_EXPERTS.match(blink_name)
    if experts:
        kind, _, index = part.partition(".")
        return f"{experts.group(1)}.{index}.{kind}_proj.weight"
    module, _, param = blink_name.rpartition(".")
    for fused_suffix in {fused for fused, _ in FUSED_PROJECTIONS.values()}:
        if module.endswith("." + fused_suffix):
            return f"{module[: -len(fused_suffix)]}{_UNFUSED_PROJECTIONS[(fused_suffix, part)]}.{param}"
    raise KeyError(blink_name)


def _expected_targets(model: nn.Module) -> set[tuple[str, str | None]]:
    """Every (parameter, part) the checkpoint must fill. Tied parameters appear once."""
    targets = set()
    for name, _ in model.named_parameters():
        module_name, _, param_name = name.rpartition(".")
        targets |= {(name, part) for part in _parts(model.get_submodule(module_name), param_name)}
    return targets


def _parts(module: nn.Module, param_name: str) -> dict[str | None, object]:
    """part -> index into the one-rank parameter, for each checkpoint tensor that fills a parameter."""
    if isinstance(module, FusedExperts):
        return module.hf_parts(param_name)
    if isinstance(module, ColumnParallelLinear) and len(module.part_slices) > 1:
        return dict(module.part_slices)
    return {None: slice(None)}


def _ignored(hf_name: str, cfg: ModelConfig) -> bool:
    # Old checkpoints carry RoPE's inv_freq buffer; tied checkpoints may repeat the embedding as lm_head.
    if hf_name.endswith("rotary_emb.inv_freq"):
        return True
    return cfg.tie_word_embeddings and hf_name == "lm_head.weight"


@torch.no_grad()
def load_hf_tensors(model: LlamaForCausalLM, named_tensors: Iterable[tuple[str, object]]) -> None:
    """Copy (HF name, tensor or safetensors slice) pairs into the model; every parameter must be filled
    exactly by them."""
    expected = _expected_targets(model)
    fused = {name for name, part in expected if part is not None}
    loaded: set[tuple[str, str | None]] = set()
    for hf_name, tensor in named_tensors:
        if _ignored(hf_name, model.config):
            continue
        name, part = to_blink_name(hf_name)
        # Phi-3's qkv_proj / gate_up_proj come fused, transformers 5's experts stacked: one tensor then
        # fills every part of a fused weight.
        whole = part is None and name in fused
        if (name, part) not in expected and not whole:
            raise WeightLoadError(f"unexpected tensor {hf_name} in the checkpoint (not part of this model)")
        module_name, _, param_name = name.rpartition(".")
        module = model.get_submodule(module_name)
        try:
            if hasattr(module, "load_hf"):
                module.load_hf(param_name, tensor, part)
            else:
                param = getattr(module, param_name)
                if source_shape(tensor) != tuple(param.shape):
                    raise ValueError(f"has shape {source_shape(tensor)}, expected {tuple(param.shape)}")
                param.copy_(read_all(tensor))
        except ValueError as e:
            raise WeightLoadError(f"{hf_name}: {e}") from None
        if whole:
            loaded |= {(name, p) for p in _parts(module, param_name)}
        else:
            loaded.add((name, part))
    missing = sorted(_hf_spelling(to_hf_name(name, part), model.config) for name, part in expected - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise WeightLoadError(f"the checkpoint lacks {len(missing)} tensor(s): {shown}")


def _hf_spelling(hf_name: str, cfg: ModelConfig) -> str:
    """Mixtral's checkpoints call the MoE block block_sparse_moe and its experts' projections w1/w3/w2."""
    if cfg.architecture != "MixtralForCausalLM" or ".experts." not in hf_name:
        return hf_name
    for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        hf_name = hf_name.replace(f".{ours}.", f".{theirs}.")
    return hf_name.replace(".mlp.", ".block_sparse_moe.")


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint dir: those its index names when sharded, else all of them."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{path} has no *.safetensors files")
    return files


def read_safetensors(files: Iterable[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, one tensor in memory at a time, in the checkpoint's own dtype, on the CPU."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)


def read_safetensors_slices(files: Iterable[Path]) -> Iterator[tuple[str, object]]:
    """(name, safetensors slice) pairs: nothing is read until the consumer indexes a slice."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_slice(name)


@torch.no_grad()
def init_random_weights_sharded(model: LlamaForCausalLM, seed: int = 0, std: float = 0.02) -> None:
    """presets.init_random_weights for one tensor-parallel shard, equal to the matching slice of the
    one-rank model's random weights: every full tensor is drawn exactly as the one-rank model draws it
    (same generator, same order, one tensor at a time on the device) and this rank keeps its slice."""
    cfg = model.config
    one_rank = LlamaForCausalLM(cfg, "meta", model.model.norm.weight.dtype, max_positions=1)
    device = model.model.norm.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)

    def full_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, meta in one_rank.named_parameters():
            full = torch.empty(meta.shape, dtype=meta.dtype, device=device)
            if name.endswith("norm.weight"):
                full.fill_(1.0)
            else:
                full.normal_(0.0, std, generator=generator)
            module_name, _, param_name = name.rpartition(".")
            for part, index in _parts(one_rank.get_submodule(module_name), param_name).items():
                yield to_hf_name(name, part), full[index]

    load_hf_tensors(model, full_tensors())


def init_preset_weights(model: LlamaForCausalLM, seed: int, tp=None) -> None:
    """Random weights for a preset; under tensor parallelism the same model as with one rank."""
    if tp is None or tp.size == 1:
        presets.init_random_weights(model, seed)
    else:
        init_random_weights_sharded(model, seed)


def resolve_dtype(dtype: str | torch.dtype | None, cfg: ModelConfig) -> torch.dtype:
    """`auto` (or None) = the checkpoint's dtype; otherwise a name from DTYPES or a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return cfg.dtype
    if dtype not in DTYPES:
        raise ModelConfigError(f"unsupported dtype {dtype!r} (choose auto, {', '.join(DTYPES)})")
    return DTYPES[dtype]


def load_model(path_or_preset: str | Path, device: str | torch.device,
               dtype: str | torch.dtype | None = "auto", max_positions: int | None = None,
               seed: int = 0, tp=None) -> tuple[LlamaForCausalLM, ModelConfig]:
    """A model from a checkpoint dir (config.json + safetensors) or a preset name (random weights).

    tp: this rank's TPGroup (None = one rank); the model then holds and loads only this rank's shard.
    """
    device = torch.device(device)
    if Path(path_or_preset).is_dir():
        cfg = ModelConfig.from_dir(path_or_preset)
        model = LlamaForCausalLM(cfg, device, resolve_dtype(dtype, cfg), tp, max_positions=max_positions)
        load_hf_tensors(model, read_safetensors_slices(checkpoint_files(path_or_preset)))
    elif str(path_or_preset) in presets.PRESETS:
        cfg = presets.get(str(path_or_preset))
        model = LlamaForCausalLM(cfg, device, resolve_dtype(dtype, cfg), tp, max_positions=max_positions)
        init_preset_weights(model, seed, tp)
    else:
        raise ModelConfigError(
            f"{path_or_preset} is neither a model directory nor a preset ({', '.join(presets.PRESETS)})"
        )
    return model.eval(), cfg
