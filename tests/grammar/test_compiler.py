"""The compiler: constraints -> flat tables whose language is exactly the constraint's."""
import json
import re

import numpy as np
import pytest

from blink.grammar.compiler import GrammarCompiler, GrammarTooLarge
from blink.grammar.schema import GrammarError, check_regex, schema_regex
from blink.grammar.tables import CLASS_EOS
from blink.grammar.vocab import token_bytes
from blink.request import Constraint


def test_demo_vocab_bytes_round_trip(demo_vocab):
    tok, eos, vocab = demo_vocab
    pieces = token_bytes(tok, vocab)
    ids = tok.encode('{"a": [1, 2], "b": "héllo"}', add_special_tokens=False).ids
    assert b"".join(pieces[i] for i in ids).decode() == '{"a": [1, 2], "b": "héllo"}'
    assert all(pieces[i] is None for i in eos)


def test_tables_accept_exactly_the_choices(demo_compiler, demo_vocab):
    tok, eos, _ = demo_vocab
    tables = demo_compiler.compile(Constraint("choice", json.dumps(["yes", "no", "maybe so"])))
    for text in ("yes", "no", "maybe so"):
        state = tables.walk(tok.encode(text, add_special_tokens=False).ids)
        assert state >= 0 and tables.next_state[state, CLASS_EOS] >= 0  # accepting: EOS allowed
    assert tables.walk(tok.encode("nope", add_special_tokens=False).ids) == -1
    assert not tables.allowed(0)[list(eos)].any()  # EOS only in accepting states


def test_walks_match_the_regex(demo_compiler, demo_vocab):
    tok, eos, _ = demo_vocab
    pattern = r"[a-c]{2,4}-[0-9]+"
    tables = demo_compiler.compile(Constraint("regex", pattern))
    rng = np.random.default_rng(0)
    for _ in range(40):  # random walks through the DFA: every accepted string matches
        state, ids = 0, []
        while len(ids) < 30:
            allowed = np.flatnonzero(tables.allowed(state))
            t = int(rng.choice(allowed))
            if t in eos:
                break
            ids.append(t)
            state = tables.walk([t], state)
        else:
            continue
        assert re.fullmatch(pattern, tok.decode(ids))


def test_classes_are_far_fewer_than_tokens(demo_compiler):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]}
    tables = demo_compiler.compile(Constraint("json_schema", json.dumps(schema)))
    assert tables.num_classes < tables.token_class.shape[0] // 4
    assert demo_compiler.compile(Constraint("json_schema", json.dumps(schema))) is tables  # cached


@pytest.mark.parametrize("schema, words", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "number", "minimum": 0}, "minimum"),
    ({"type": "string", "format": "hostname"}, "hostname"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "empty integer range"),
])
def test_unenforced_keywords_are_refused_by_name(schema, words):
    with pytest.raises(GrammarError, match=words):
        schema_regex(schema)


def test_invalid_schema_and_regex():
    with pytest.raises(GrammarError, match="invalid JSON schema"):
        schema_regex({"type": "objekt"})
    with pytest.raises(GrammarError, match="invalid regex"):
        check_regex("a(b")


def test_bounded_integers_are_enforced(demo_compiler, demo_vocab):
    tok, _, _ = demo_vocab
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 12}},
              "required": ["n"], "additionalProperties": False}
    tables = demo_compiler.compile(Constraint("json_schema", json.dumps(schema)))
    for n, ok in ((3, True), (12, True), (13, False), (2, False), (-4, False)):
        state = tables.walk(tok.encode(f'{{"n": {n}}}', add_special_tokens=False).ids)
        assert (state >= 0 and tables.next_state[state, CLASS_EOS] >= 0) == ok, n


def test_too_large_for_the_arena(demo_vocab):
    tok, eos, vocab = demo_vocab
    small = GrammarCompiler(token_bytes(tok, vocab), eos, max_states=64, max_cells=4096)
    with pytest.raises(GrammarTooLarge):
        small.compile(Constraint("regex", "[a-z]{200}"))
