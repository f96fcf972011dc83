"""Per request, on the CPU, cached: a Constraint -> GrammarTables over the model's vocabulary.

outlines-core builds the token-level DFA (chosen by measurement: docs/perf.md, "Structured outputs");
tables.py flattens it. The front end compiles to validate (a 400 names the bad field) and the engine
compiles again from the same text (same cache key) before it loads the tables into its GPU arena.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

from blink.grammar.reasoning import parse_reasoned, reasoned_regex
from blink.grammar.schema import (  # noqa: F401 (GrammarTooLarge: re-exported)
    GrammarError,
    GrammarTooLarge,
    check_regex,
    choice_regex,
    json_object_regex,
    schema_regex,
)
from blink.grammar.tables import GrammarTables, build_tables
from blink.request import Constraint

CACHE_ENTRIES = 64


def constraint_regex(c: Constraint) -> str:
    if c.kind == "regex":
        return check_regex(c.spec)
    if c.kind == "choice":
        return choice_regex(json.loads(c.spec))
    if c.kind == "json_object":
        return json_object_regex()
    if c.kind == "json_schema":
        try:
            schema = json.loads(c.spec)
        except json.JSONDecodeError as e:
            raise GrammarError(f"the schema is not valid JSON: {e}") from None
        return schema_regex(schema)
    if c.kind == "reasoned":
        try:
            inner, open_tag, close_tag, starts_open = parse_reasoned(c.spec)
        except ValueError as e:
            raise GrammarError(str(e)) from None
        # The inner's own checks (MAX_REGEX_CHARS among them) apply to it alone: the wrapper's few hundred
        # characters never push an accepted inner over a limit.
        return reasoned_regex(open_tag, close_tag, starts_open, constraint_regex(inner))
    raise GrammarError(f"unknown constraint kind {c.kind!r}")


class GrammarCompiler:
    def __init__(self, pieces: list[bytes | None], eos_ids: tuple[int, ...], max_states: int, max_cells: int):
        """pieces: token_bytes(tokenizer, vocab_size); max_states, max_cells: the arena's capacity."""
        from outlines_core import Vocabulary

        self.vocab_size = len(pieces)
        self.eos_ids = tuple(eos_ids)
        self.max_states, self.max_cells = max_states, max_cells
        grouped: dict[bytes, list[int]] = {}
        for tid, piece in enumerate(pieces):
            if piece and tid not in self.eos_ids:
                grouped.setdefault(piece, []).append(tid)
        if not grouped:
            raise ValueError("the vocabulary has no text tokens")
        # outlines needs an EOS id of its own; its EOS edges are dropped (tables.CLASS_EOS covers them).
        self._vocabulary = Vocabulary(self.eos_ids[0] if self.eos_ids else len(pieces), grouped)
        self._cache: OrderedDict[Constraint, GrammarTables] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, c: Constraint) -> GrammarTables:
        with self._lock:
            if c in self._cache:
                self._cache.move_to_end(c)
                return self._cache[c]
        tables = self._build(c)
        with self._lock:
            self._cache[c] = tables
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return tables

    def _build(self, c: Constraint) -> GrammarTables:
        from outlines_core import Index

        regex = constraint_regex(c)
        try:
            index = Index(regex, self._vocabulary)
        except (ValueError, RuntimeError) as e:
            raise GrammarError(f"cannot build an automaton over this vocabulary: {str(e).splitlines()[0]}") from None
        try:
            return build_tables(index.get_transitions(), index.get_initial_state(), set(index.get_final_states()),
                                self.vocab_size, self.eos_ids, self.max_states, self.max_cells)
        except OverflowError as e:
            raise GrammarTooLarge(f"the constraint is too large for the grammar arena: {e}") from None
