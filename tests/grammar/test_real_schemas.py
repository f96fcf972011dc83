"""Real-world schemas (tests/data/jsonschemabench, see SOURCE.md): the share that compiles, and every
output the grammar lets through validates. Outputs are random walks through the token automaton,
which is what a random-weight model is reduced to under the mask."""
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from blink.grammar.compiler import GrammarCompiler
from blink.grammar.schema import GrammarError
from blink.grammar.vocab import token_bytes
from blink.request import Constraint

DATA = Path(__file__).parent.parent / "data" / "jsonschemabench"
WALK_TOKENS = 400
MIN_COMPILE_SHARE = 0.6  # measured 33/50 on 2026-12-01 (docs/perf.md): a drop means a regression


def walk(tables, eos, rng):
    state, ids = 0, []
    for _ in range(WALK_TOKENS):
        allowed = tables.allowed(state)
        choices = np.flatnonzero(allowed)
        choices = choices[~np.isin(choices, eos)]
        ends = allowed[list(eos)].any()
        assert ends or len(choices), "a dead state: nothing allowed"
        if ends and (not len(choices) or rng.random() < 0.5):
            return ids
        t = int(rng.choice(choices))
        ids.append(t)
        state = tables.walk([t], state)
    return None  # still going: counted as unfinished (max_tokens), not validated


@pytest.fixture(scope="module")
def results(demo_vocab):
    tok, eos, vocab = demo_vocab
    compiler = GrammarCompiler(token_bytes(tok, vocab), eos, max_states=1 << 15, max_cells=1 << 22)
    rng = np.random.default_rng(0)
    out = {}
    for path in sorted(DATA.glob("*.json")):
        schema = json.loads(path.read_text())
        try:
            tables = compiler.compile(Constraint("json_schema", json.dumps(schema)))
        except GrammarError as e:
            out[path.name] = ("refused", str(e)[:100])
            continue
        texts = [walk(tables, eos, rng) for _ in range(3)]
        out[path.name] = ("compiled", schema, [tok.decode(ids) for ids in texts if ids is not None])
    return out


def test_share_that_compiles(results):
    compiled = sum(r[0] == "compiled" for r in results.values())
    print(f"\n{compiled}/{len(results)} real-world schemas compile")
    for name, r in results.items():
        if r[0] == "refused":
            print(f"  refused {name}: {r[1]}")
    assert len(results) == 50 and compiled / len(results) >= MIN_COMPILE_SHARE


def test_every_finished_output_validates(results):
    finished = 0
    for r in results.values():
        if r[0] != "compiled":
            continue
        for text in r[2]:
            jsonschema.validate(json.loads(text, strict=True), r[1])
            finished += 1
    print(f"\n{finished} finished outputs, all valid")
    assert finished > 0
