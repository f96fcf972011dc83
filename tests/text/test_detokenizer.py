"""Incremental detokenization (multi-byte UTF-8, leading spaces) and stop-string matching."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from blink.model.demo import build_tokenizer
from blink.text.detokenizer import IncrementalDetokenizer, StopStringMatcher
from blink.text.tokenizer import ModelTokenizer

TEXT = "Hello wörld, naïve café! 你好，世界。 Emoji: 🙂👍🏽 and math ∑x² — done.  Two  spaces."


def wrap(tokenizer: Tokenizer) -> ModelTokenizer:
    return ModelTokenizer(tokenizer, tokenizer.get_vocab_size(), None)


def sentencepiece_like() -> Tokenizer:
    """A Metaspace BPE: decoding drops the leading space of the first token, as Llama 2 / Mistral do."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>"], show_progress=False)
    tokenizer.train_from_iterator([TEXT, "Hello world again and again, the end."], trainer=trainer)
    return tokenizer


def stream(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = [detokenizer.add(t) for t in ids]
    return deltas + [detokenizer.flush()]


@pytest.mark.parametrize("make", [build_tokenizer, sentencepiece_like], ids=["byte-level", "metaspace"])
def test_joined_deltas_equal_the_full_decode(make):
    tok = wrap(make())
    ids = tok.encode(TEXT, add_special_tokens=False)
    for split in (1, 3, len(ids) // 2):
        prompt, output = ids[:split], ids[split:]
        deltas = stream(IncrementalDetokenizer(tok, prompt), output)
        expected = tok.decode(prompt + output)[len(tok.decode(prompt)):]
        assert "".join(deltas) == expected
        assert not any("\ufffd" in d for d in deltas)  # split characters are held back, never garbled


def test_multibyte_characters_are_held_until_complete():
    tok = wrap(build_tokenizer())
    ids = tok.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # byte-level: the emoji spans several tokens
    deltas = stream(IncrementalDetokenizer(tok, tok.encode("Hi", add_special_tokens=False)), ids)
    assert deltas[:-2] == [""] * (len(ids) - 1) and deltas[-2] == "🙂"


def test_leading_space_kept_after_the_prompt():
    tok = wrap(sentencepiece_like())
    ids = tok.encode("Hello world again", add_special_tokens=False)
    first_word = len(tok.encode("Hello", add_special_tokens=False))
    deltas = stream(IncrementalDetokenizer(tok, ids[:first_word]), ids[first_word:])
    assert "".join(deltas) == " world again"


def test_incomplete_character_flushed_at_the_end():
    tok = wrap(build_tokenizer())
    ids = tok.encode("你", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tok, [5])
    assert detokenizer.add(ids[0]) == ""
    assert detokenizer.flush() == "\ufffd"


def test_random_token_streams_never_lose_text():
    tok = wrap(build_tokenizer())
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(5, tok.vocab_size) for _ in range(30)]  # skip the specials
        deltas = stream(IncrementalDetokenizer(tok, [7]), ids)
        assert "".join(deltas) == tok.decode([7] + ids)[len(tok.decode([7])):]


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> tuple[str, bool]:
    out, stopped = [], False
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


@pytest.mark.parametrize("pieces,stop,expected,stopped", [
    (["Hello", " wor", "ld", "!"], ["world"], "Hello ", True),
    (["ab", "c", "de"], ["cd"], "ab", True),
    (["x", "y", "z"], ["yz", "xy"], "", True),  # the earliest match wins
    (["Hel", "lo"], ["lol"], "Hello", False),  # a partial match is released at the end
    (["a\n", "\nb"], ["\n\n"], "a", True),
    (["no stop here"], [], "no stop here", False),
])
def test_stop_strings(pieces, stop, expected, stopped):
    assert feed_all(StopStringMatcher(stop), pieces) == (expected, stopped)


def test_partial_stop_is_held_back_then_released():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abcST") == ("abc", False)
    assert matcher.feed("x") == ("STx", False)
    assert matcher.feed("S") == ("", False)
    assert matcher.feed("TOP tail") == ("", True)


def test_stops_before_min_tokens_are_ignored():
    matcher = StopStringMatcher(["b"])
    assert matcher.feed("ab", check=False) == ("ab", False)
    assert matcher.feed("cb") == ("c", True)


def test_include_stop_string():
    for include, expected in ((False, "one two"), (True, "one two three")):
        matcher = StopStringMatcher([" three", "fo"], include_stop=include)
        assert feed_all(matcher, ["one", " two", " th", "ree four"]) == (expected, True)
        assert matcher.matched == " three"
