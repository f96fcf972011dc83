"""The server's defaults for what a request leaves unset: its sampling fields take the model's own
recommendation, as vLLM does with `--generation-config auto` (its default) and `--override-generation-config`;
its chat template arguments take `--default-chat-template-kwargs`.

A model's generation_config.json often says how it should be sampled (Qwen3: temperature 0.6, top_p 0.95,
top_k 20); without this a request that names none of them would get temperature 1 and no filter.
"""
from __future__ import annotations

import json
from pathlib import Path

# The keys vLLM takes from a generation config; max_new_tokens becomes the default max_tokens.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
OVERRIDE_KEYS = (*SAMPLING_KEYS, "max_new_tokens")


def _checked(values: dict, origin: str) -> dict:
    out = {}
    for key, value in values.items():
        if key not in OVERRIDE_KEYS:
            raise ValueError(f"{origin}: {key!r} is not a sampling default ({', '.join(OVERRIDE_KEYS)})")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{origin}: {key} must be a number, got {value!r}")
        out["max_tokens" if key == "max_new_tokens" else key] = int(value) if key in ("top_k", "max_new_tokens") \
            else float(value)
    return out


def sampling_defaults(model: str, source: str = "auto", override: str | None = None) -> dict:
    """The defaults as SamplingParams' names (max_tokens for max_new_tokens); ValueError in one line.

    source: `auto` (the model dir's generation_config.json, when it has one), `vllm` (none: blink's own
    defaults), or a directory holding a generation_config.json. override: a JSON object on top."""
    found: dict = {}
    if source != "vllm":
        folder = Path(model) if source == "auto" else Path(source)
        path = folder / "generation_config.json"
        if path.is_file():
            found = json.loads(path.read_text())
        elif source != "auto":
            raise ValueError(f"--generation-config {source}: no generation_config.json there")
    defaults = _checked({k: found[k] for k in OVERRIDE_KEYS if k in found}, str(source))
    if override:
        defaults.update(_checked(_json_object(override, "--override-generation-config"),
                                 "--override-generation-config"))
    return defaults


def template_kwargs(text: str | None) -> dict:
    """--default-chat-template-kwargs: a JSON object (e.g. {"enable_thinking": false}); ValueError in one line."""
    return _json_object(text, "--default-chat-template-kwargs") if text else {}


def _json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object")
    return value
