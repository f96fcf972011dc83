"""The "reasoned" constraint: free thought up to the close tag, then the inner constraint (one regex)."""
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.grammar import schema
from blink.grammar.compiler import constraint_regex
from blink.grammar.reasoning import reasoned_constraint, reasoned_regex, text_before
from blink.grammar.schema import GrammarError, GrammarTooLarge
from blink.grammar.tables import CLASS_EOS
from blink.request import CONSTRAINT_KINDS, Constraint
from blink.transport.ingress import _constraint_words, _decode_constraint

SCHEMA = Constraint("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                               "required": ["a"], "additionalProperties": False}))
WORD = Constraint("regex", "[a-z]{2,5}")


def _texts(tag: str):
    """Strings built from the tag's own pieces, so that near misses and real occurrences are common."""
    pieces = [tag, tag[:-1], tag[:2], tag[0], tag[1:], "a", "\n", "K", " "]
    return st.lists(st.sampled_from(pieces) | st.text(alphabet=tag + "aK\n", max_size=4), max_size=8).map("".join)


@pytest.mark.parametrize("tag", ["</think>", "[/THINK]", "<|end|>", "ab", "|"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_text_before_is_exactly_the_text_without_the_tag(tag, data):
    s = data.draw(_texts(tag))
    r, close = text_before(tag), re.escape(tag)
    assert bool(re.fullmatch(r, s)) == (tag not in s)
    assert bool(re.fullmatch(r + close, s + tag)) == (tag not in s)  # the first close tag ends the thought


def test_reasoned_regex_shape():
    assert reasoned_regex("<think>", "</think>", True, "x").endswith("</think>[ \\n]{0,2}(x)")
    assert reasoned_regex("<think>", "</think>", False, "x").startswith("<think>(?:")
    assert reasoned_regex("<think>", "</think>", False, "x").endswith("</think>[ \\n]{0,2}(x)")


def _accepts(tables, tok, text: str) -> bool:
    state = tables.walk(tok.encode(text, add_special_tokens=False).ids)
    return state >= 0 and tables.next_state[state, CLASS_EOS] >= 0  # EOS allowed: an accepting state


@pytest.mark.parametrize("inner, good, bad", [
    (SCHEMA, ['{"a":5}', '{"a": 5}', '{ "a": -12 }'], ['{"a": "5"}', '{"b": 5}', '{"a": 5', '{"a":5}\n']),
    (WORD, ["ab", "hello"], ["a", "toolong", "AB"]),
])
def test_starts_open(demo_compiler, demo_vocab, inner, good, bad):
    tok = demo_vocab[0]
    tables = demo_compiler.compile(reasoned_constraint(inner, "<think>", "</think>", starts_open=True))
    thoughts = ["let me think", "", "a < b, </ and </thin and <think> inside\n\nstill thinking", "<<//</thinkk"]
    for thought in thoughts:
        for ws in ("", "\n", "\n\n", " "):
            for out in good:
                assert _accepts(tables, tok, f"{thought}</think>{ws}{out}"), (thought, ws, out)
            for out in bad:
                assert not _accepts(tables, tok, f"{thought}</think>{ws}{out}"), (thought, ws, out)
        assert not _accepts(tables, tok, f"{thought}</think>\n\n\n{good[0]}")  # WS is bounded
        assert not _accepts(tables, tok, f"{thought}</think>{good[0]}</think>")  # one thought only
        assert not _accepts(tables, tok, f"{thought}</think></think>{good[0]}")
        assert not _accepts(tables, tok, f"{thought} {good[0]}")  # the close tag is required
        assert tables.walk(tok.encode(thought, add_special_tokens=False).ids) >= 0  # still thinking: alive


def test_starts_open_thought_may_contain_the_open_tag(demo_compiler, demo_vocab):
    tok = demo_vocab[0]
    tables = demo_compiler.compile(reasoned_constraint(WORD, "<think>", "</think>", starts_open=True))
    # text before the close tag is free, an open tag included (it is just thought)
    assert _accepts(tables, tok, "<think>x</think>abc")


def test_not_starts_open(demo_compiler, demo_vocab):
    tok = demo_vocab[0]
    for inner, out in ((WORD, "abc"), (SCHEMA, '{"a": 5}')):
        tables = demo_compiler.compile(reasoned_constraint(inner, "<think>", "</think>", starts_open=False))
        assert not _accepts(tables, tok, out)  # the model opens its thought itself: the tag is required
        assert _accepts(tables, tok, f"<think></think>{out}")  # an empty thought (Qwen3's /no_think)
        assert _accepts(tables, tok, f"<think>hmm</think>{out}")
        assert _accepts(tables, tok, f"<think>a </thin <b></think>\n\n{out}")
        assert not _accepts(tables, tok, f"hmm</think>{out}")  # a thought must be opened
        assert not _accepts(tables, tok, f"<think>hmm</think>{out}</think>")
        assert not _accepts(tables, tok, f"<think>hmm{out}")


@pytest.mark.parametrize("open_tag, close_tag", [("[THINK]", "[/THINK]"), ("<|think|>", "<|end|>"),
                                                 ("◁think▷", "◁/think▷")])
def test_other_tags_compile_in_outlines(demo_compiler, demo_vocab, open_tag, close_tag):
    tok = demo_vocab[0]
    for starts_open, prefix in ((True, ""), (False, open_tag)):
        tables = demo_compiler.compile(reasoned_constraint(WORD, open_tag, close_tag, starts_open))
        assert _accepts(tables, tok, f"{prefix}a {close_tag[:-1]} b{close_tag}\nabc")
        assert not _accepts(tables, tok, f"{prefix}a{close_tag}abc{close_tag}")


def test_ring_round_trip():
    c = reasoned_constraint(SCHEMA, "<think>", "</think>", True)
    assert CONSTRAINT_KINDS[:4] == ("json_schema", "json_object", "regex", "choice")  # indices on the ring
    assert _decode_constraint(_constraint_words(c)) == c
    assert json.loads(c.spec) == {"inner": {"kind": "json_schema", "spec": SCHEMA.spec}, "open": "<think>",
                                  "close": "</think>", "starts_open": True}
    assert reasoned_constraint(SCHEMA, "<think>", "</think>", True) == c  # same text: one cache entry


@pytest.mark.parametrize("args", [
    (reasoned_constraint(WORD, "<think>", "</think>", True), "<think>", "</think>", True),  # nested
    (WORD, "", "</think>", True),
    (WORD, "<think>", "", True),
    (WORD, "<think>", "<x<", True),  # the close tag's first character recurs
])
def test_refusals(args):
    with pytest.raises(ValueError):
        reasoned_constraint(*args)


@pytest.mark.parametrize("spec", [
    "not json", "[]", "{}", json.dumps({"inner": {"kind": "regex", "spec": "a"}, "open": "<t>", "close": "<<"}),
    json.dumps({"inner": {"kind": "regex", "spec": "a"}, "open": "<t>", "close": "</t>", "starts_open": "yes"}),
    json.dumps({"inner": {"kind": "nope", "spec": "a"}, "open": "<t>", "close": "</t>", "starts_open": True}),
    json.dumps({"inner": {"kind": "regex", "spec": "("}, "open": "<t>", "close": "</t>", "starts_open": True}),
])
def test_malformed_specs_are_grammar_errors(spec):
    with pytest.raises(GrammarError):
        constraint_regex(Constraint("reasoned", spec))


def test_the_size_limit_applies_to_the_inner_alone(monkeypatch):
    inner_chars = len(constraint_regex(SCHEMA))
    wrapped = reasoned_constraint(SCHEMA, "<think>", "</think>", False)
    monkeypatch.setattr(schema, "MAX_REGEX_CHARS", inner_chars)
    assert len(constraint_regex(wrapped)) > inner_chars  # the wrapper's characters do not count
    monkeypatch.setattr(schema, "MAX_REGEX_CHARS", inner_chars - 1)
    with pytest.raises(GrammarTooLarge):
        constraint_regex(wrapped)
