"""The demo model: built deterministically on first use into $BLINK_CACHE, and a working checkpoint."""
from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer

from blink.model.config import ModelConfig
from blink.model.demo import CHAT_TEMPLATE, EOT, build_demo_model, ensure_default_model
from blink.model.weights import load_model
from tests.model.paged import PagedDriver


def test_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE", str(tmp_path / "cache"))
    path = ensure_default_model()
    assert path == tmp_path / "cache" / "demo-model"
    files = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
             "tokenizer_config.json"}
    assert files <= {p.name for p in path.iterdir()}
    assert sum(p.stat().st_size for p in path.iterdir()) < 8 << 20
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_model() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in path.parent.iterdir()] == ["demo-model"]  # no staging dirs left behind


def test_deterministic(tmp_path):
    build_demo_model(tmp_path / "a")
    build_demo_model(tmp_path / "b")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_is_a_working_checkpoint(tmp_path):
    build_demo_model(tmp_path)
    cfg = ModelConfig.from_dir(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert cfg.vocab_size == tokenizer.get_vocab_size() and 900 < cfg.vocab_size <= 2048
    assert tokenizer.token_to_id(EOT) in cfg.eos_token_ids
    text = "Hello! How are you today? Zebras eat 42 apples, ünïcode ✓."
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("Thank you very much for your help.").ids) <= 10  # trained merges
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    model, _ = load_model(tmp_path, "cpu")
    logits = PagedDriver(model).step({0: ids})[0]
    assert logits.shape == (len(ids), cfg.vocab_size) and torch.isfinite(logits).all()


def test_chat_template_renders_with_transformers(tmp_path):
    from transformers import AutoTokenizer

    build_demo_model(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|begin_of_text|><|start_header|>user<|end_header|>\n\nHi<|eot|>" \
                     "<|start_header|>assistant<|end_header|>\n\n"


def test_an_older_version_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE", str(tmp_path))
    stale = tmp_path / "demo-model"
    stale.mkdir()
    (stale / "blink_demo_version").write_text("0")
    (stale / "leftover.bin").write_text("old")
    path = ensure_default_model()
    assert not (path / "leftover.bin").exists() and (path / "config.json").is_file()
