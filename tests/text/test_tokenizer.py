"""Front-end tokenizer loading and chat templates, checked against transformers."""
from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from blink.model import presets
from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import make_tokenizer_only_model

KWARGS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | trim }}"
    "{% if loop.last and not add_generation_prompt %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% if enable_thinking %}<think>{% endif %}{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": " Héllo, 你好! "},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Tell me more."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("tok"))


def reference_ids(path, messages, **kwargs) -> list[int]:
    hf = PreTrainedTokenizerFast.from_pretrained(str(path))
    return hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(model_dir, add_generation_prompt):
    tok = load_tokenizer(str(model_dir))
    text = tok.chat_template.render(MESSAGES, add_generation_prompt)
    assert tok.encode(text, add_special_tokens=False) == reference_ids(
        model_dir, MESSAGES, add_generation_prompt=add_generation_prompt)


def test_chat_template_file_and_kwargs(model_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (tmp_path / name).write_text((model_dir / name).read_text())
    (tmp_path / "chat_template.jinja").write_text(KWARGS_TEMPLATE)  # wins over tokenizer_config's
    tok = load_tokenizer(str(tmp_path))
    for kwargs in ({}, {"enable_thinking": True}):
        text = tok.chat_template.render(MESSAGES, True, **kwargs)
        assert text.endswith("<think>") == bool(kwargs)
        assert text.startswith("<|begin_of_text|>[system]Be kind.")
        assert tok.encode(text, add_special_tokens=False) == reference_ids(
            tmp_path, MESSAGES, add_generation_prompt=True, **kwargs)


def test_template_errors_are_value_errors(model_dir, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_text((model_dir / name).read_text())
    config = {"chat_template": "{{ raise_exception('no system role') }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no system role"):
        load_tokenizer(str(tmp_path)).chat_template.render(MESSAGES)


def test_model_dir_limits(model_dir):
    tok = load_tokenizer(str(model_dir))
    assert tok.vocab_size == json.loads((model_dir / "config.json").read_text())["vocab_size"]


def test_preset_gets_a_synthetic_word_tokenizer():
    tok = load_tokenizer("llama3.2-1b")
    config = presets.get("llama3.2-1b")
    assert tok.vocab_size == tok.tokenizer.get_vocab_size() == config.vocab_size
    assert tok.encode("w5 w128255  w17") == [5, config.vocab_size - 1, 17]
    assert tok.decode([1, 2, 3]) == "w1 w2 w3"
    prompt = tok.chat_template.render([{"role": "user", "content": "w9 w10"}])
    assert tok.encode(prompt) == [0, 9, 10, 0]  # "user:" and "assistant:" are unknown words -> w0


def test_preset_with_a_tokenizer_dir_spells_with_that_vocab(model_dir):
    """A preset's shapes over a real vocabulary (what structured outputs on a preset need): the logits keep
    the preset's width, the text comes from the dir's tokenizer."""
    tok = load_tokenizer("llama3.2-1b", str(model_dir))
    own = load_tokenizer(str(model_dir))
    assert tok.vocab_size == presets.get("llama3.2-1b").vocab_size != own.vocab_size
    assert tok.encode("Hello, world") == own.encode("Hello, world")
    assert tok.decode(own.encode("Hello, world"), skip_special_tokens=True) == "Hello, world"


def test_preset_refuses_a_tokenizer_larger_than_its_vocab(model_dir, monkeypatch):
    small = presets.get("llama3.2-1b").__class__(**{**vars(presets.get("llama3.2-1b")), "vocab_size": 8})
    monkeypatch.setattr(presets, "get", lambda name: small)
    with pytest.raises(ValueError, match="more than preset"):
        load_tokenizer("llama3.2-1b", str(model_dir))
