"""The front end's tokenizer: HF `tokenizers` from a model dir, or a synthetic word-level one for presets.

A preset (e.g. "llama3-8b") has random weights and no tokenizer, so it gets token i <-> "w{i}" with a
whitespace pre-tokenizer, sized to the preset's vocab: text prompts and the benchmark then work on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from blink.text.chat_template import ChatTemplate, chat_template_source

PRESET_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass
class ModelTokenizer:
    """A tokenizer plus what the API needs from the model dir: vocab size and chat template (the context
    length is the engine's: it publishes its limits in the control block)."""

    tokenizer: Tokenizer
    vocab_size: int  # the model's (logits) vocab: valid token ids are [0, vocab_size)
    chat_template: ChatTemplate | None
    _longest_token: int | None = None  # computed on first use by min_tokens (0 = no bound)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # The batch forms release the GIL (the plain ones do not): the worker pool calls these.
    def encode_released(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode_released(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)) from its length alone (0 when the model gives none).

        A BPE token spells at most `longest` characters of its vocabulary entry (byte-level entries spell
        one character per byte), so n characters need at least n / longest tokens. Normalizers may
        shorten text a little (strip, NFKC), hence the factor 2. A word-level or fused-unknown model
        can spell any length with one token: no bound.
        """
        if self._longest_token is None:
            self._longest_token = _longest_token_chars(self.tokenizer)
        return len(text) // (2 * self._longest_token) if self._longest_token else 0

    def token_text(self, token_id: int) -> str:
        """A single token's text as a client sees it (logprobs entries)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)



def load_tokenizer(model_or_preset: str, tokenizer_dir: str | None = None,
                   chat_template: str | None = None) -> ModelTokenizer:
    """Load from a model dir (tokenizer files may live in `tokenizer_dir`), or build one for a preset.
    chat_template: --chat-template (a file or the template itself), over the model's own."""
    model_path = Path(model_or_preset)
    override = chat_template_source(chat_template) if chat_template else None
    if model_path.is_dir():
        return _from_dir(model_path, Path(tokenizer_dir) if tokenizer_dir else model_path, override)
    if tokenizer_dir:  # a preset's shapes with a real vocabulary (structured outputs need one that spells JSON)
        return _preset_with_dir(model_or_preset, Path(tokenizer_dir), override)
    return _for_preset(model_or_preset, override)


def _from_dir(model_dir: Path, tokenizer_dir: Path, override: str | None = None) -> ModelTokenizer:
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"{tokenizer_dir} has no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    config = _read_json(model_dir / "config.json")
    config = config.get("text_config", config)
    tokenizer_config = _read_json(tokenizer_dir / "tokenizer_config.json")
    template_file = tokenizer_dir / "chat_template.jinja"
    if override:
        template_source = override
    elif template_file.is_file():
        template_source = template_file.read_text()
    else:
        template_source = tokenizer_config.get("chat_template")
    if isinstance(template_source, list):  # [{"name": "default", "template": ...}, ...]
        by_name = {t.get("name"): t.get("template") for t in template_source}
        template_source = by_name.get("default") or next(iter(by_name.values()), None)
    chat_template = None
    if template_source:
        chat_template = ChatTemplate(template_source, _special_tokens(tokenizer_config))
    return ModelTokenizer(
        tokenizer=tokenizer,
        vocab_size=int(config.get("vocab_size") or tokenizer.get_vocab_size()),
        chat_template=chat_template,
    )


def _for_preset(name: str, override: str | None = None) -> ModelTokenizer:
    from blink.model import presets  # imported late: a model dir must not need the preset table

    config = presets.get(name)
    return ModelTokenizer(
        tokenizer=synthetic_tokenizer(config.vocab_size),
        vocab_size=config.vocab_size,
        chat_template=ChatTemplate(override or PRESET_CHAT_TEMPLATE, {}),
    )


def _preset_with_dir(name: str, tokenizer_dir: Path, override: str | None = None) -> ModelTokenizer:
    """The preset's vocab size (the logits' width) over the dir's tokenizer, as a padded real vocab: ids the
    tokenizer lacks decode to nothing. A tokenizer larger than the preset's vocab cannot be served."""
    from blink.model import presets

    config = presets.get(name)
    loaded = _from_dir(tokenizer_dir, tokenizer_dir, override)
    size = loaded.tokenizer.get_vocab_size(with_added_tokens=True)
    if size > config.vocab_size:
        raise ValueError(f"tokenizer {tokenizer_dir} has {size} tokens, more than preset {name}'s vocab of "
                         f"{config.vocab_size}")
    template = loaded.chat_template or ChatTemplate(PRESET_CHAT_TEMPLATE, {})
    return ModelTokenizer(tokenizer=loaded.tokenizer, vocab_size=config.vocab_size, chat_template=template)


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    """Token i <-> word "w{i}"; unknown words map to token 0; decoding joins words with spaces."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # A word-piece decoder with a prefix no word has joins tokens with single spaces, no cleanup.
    tokenizer.decoder = decoders.WordPiece(prefix="\x00", cleanup=False)
    return tokenizer


def _longest_token_chars(tokenizer: Tokenizer) -> int:
    model = tokenizer.model
    if not isinstance(model, models.BPE) or (model.fuse_unk and not model.byte_fallback):
        return 0
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(token) for token in vocab), default=0)


def _special_tokens(tokenizer_config: dict) -> dict[str, str]:
    """bos_token, eos_token, ... as strings (they may be AddedToken dicts) for the chat template."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
