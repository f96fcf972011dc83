"""A Hugging Face model dir for the serving peer of issue 6 (`transformers serve`): a blink preset's shapes
with random weights (HF's own init, seed 0) in bf16 safetensors, plus blink's synthetic word-level
tokenizer (token i <-> "w{i}"), so that `blink serve --model DIR` and `transformers serve DIR` serve the
very same weights and tokenization.

    python tools/hf_peer.py llama3-8b /tmp/hf-llama3-8b [--num-layers N] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from blink.model.presets import PRESETS
from blink.text.tokenizer import synthetic_tokenizer


def build(preset: str, out: Path, num_layers: int | None, device: str) -> None:
    hf_dict = dict(PRESETS[preset])
    if num_layers:
        hf_dict["num_hidden_layers"] = num_layers
    model_type = hf_dict["architectures"][0].replace("ForCausalLM", "").lower()
    cfg = AutoConfig.for_model(model_type, **hf_dict)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    synthetic_tokenizer(cfg.vocab_size).save(str(out / "tokenizer.json"))
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else (cfg.eos_token_id or [0])[0]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0", "eos_token": f"w{eos}",
        "model_max_length": cfg.max_position_embeddings}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is faster for 8B)")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    build(ns.preset, ns.out, ns.num_layers, ns.device)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
