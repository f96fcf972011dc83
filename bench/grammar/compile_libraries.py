"""Compare outlines-core, xgrammar and llguidance on this machine (docs/perf.md, structured outputs).

    python -m bench.grammar.compile_libraries [--vocab 32000] [--repeat 3]

The vocabulary is a byte-level BPE trained here on the Python standard library's sources (no model
hub is reachable), sized like Llama 2 / Mistral (32k) by default. Per library and schema: compile time
(median of --repeat cold compiles), the size of what it builds, and which JSON-schema keywords it
accepts. Only outlines-core builds a finished token-level DFA (Index.get_transitions) that exports as
flat tables; xgrammar (pushdown automaton + per-state mask cache) and llguidance (Earley parser) compute
each step's mask on the CPU from a parser stack, so they are timed for reference only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from blink.grammar.vocab import token_bytes

SCHEMAS = {
    "enum+int": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                 "n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["color", "n"],
                 "additionalProperties": False},
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
               "age": {"type": "integer"}, "email": {"type": "string", "format": "email"},
               "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
               "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
               "id": {"type": "integer"}, "address": {"type": "object", "properties": {
                   "city": {"type": "string"}, "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                   "required": ["city", "zip"], "additionalProperties": False}},
               "required": ["id", "address"], "additionalProperties": False},
               "active": {"type": "boolean"}}, "required": ["user", "active"], "additionalProperties": False},
    "tool-call": {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
                  "type": "object", "properties": {"location": {"type": "string"},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["location", "unit"], "additionalProperties": False}},
                  "required": ["name", "arguments"], "additionalProperties": False},
    "array-of-objects": {"type": "array", "maxItems": 5, "items": {"type": "object", "properties": {
                         "sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1},
                         "price": {"type": "number"}}, "required": ["sku", "qty", "price"],
                         "additionalProperties": False}},
}

_S = {"type": "string"}
KEYWORD_PROBES = {
    "enum": {"enum": ["a", "b", 3]}, "const": {"const": "x"},
    "integer min/max": {"type": "integer", "minimum": -5, "maximum": 500},
    "exclusiveMinimum": {"type": "integer", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 8},
    "pattern": {"type": "string", "pattern": "^[a-z]+-[0-9]+$"},
    "format date-time": {"type": "string", "format": "date-time"},
    "minItems/maxItems": {"type": "array", "items": _S, "minItems": 1, "maxItems": 3},
    "uniqueItems": {"type": "array", "items": _S, "uniqueItems": True},
    "required + additionalProperties false": {"type": "object", "properties": {"a": _S}, "required": ["a"],
                                              "additionalProperties": False},
    "anyOf": {"anyOf": [_S, {"type": "integer"}]}, "oneOf": {"oneOf": [_S, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": _S}}, {"required": ["a"]}]},
    "$ref/$defs": {"$defs": {"p": _S}, "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}},
    "recursive $ref": {"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array",
                       "items": {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"},
    "patternProperties": {"type": "object", "patternProperties": {"^x": _S}},
    "not": {"not": {"type": "string"}},
    "if/then": {"if": {"type": "string"}, "then": {"maxLength": 3}},
    "type list": {"type": ["string", "null"]},
}


def train_vocab(size: int) -> Tokenizer:
    cache = Path.home() / ".cache" / "blink" / f"bench-bpe-{size}.json"
    if cache.is_file():
        return Tokenizer.from_file(str(cache))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = sorted(str(p) for p in Path(sys.prefix, "lib").rglob("*.py"))[:4000]
    tok.train(files, trainer)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(cache))
    return tok


class Outlines:
    name = "outlines-core"

    def __init__(self, pieces: list[bytes | None], eos: int):
        from outlines_core import Vocabulary

        grouped: dict[bytes, list[int]] = {}
        for tid, b in enumerate(pieces):
            if b is not None and tid != eos:
                grouped.setdefault(b, []).append(tid)
        self.vocab = Vocabulary(eos, grouped)

    def compile(self, schema: dict):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        index = Index(build_regex_from_schema(json.dumps(schema)), self.vocab)
        edges = index.get_transitions()
        return {"states": len(edges), "edges": sum(len(e) for e in edges.values())}


class BlinkTables:
    """outlines-core's DFA flattened into blink's class tables (what the GPU arena holds)."""

    name = "blink tables"

    def __init__(self, pieces: list[bytes | None], eos: int):
        from blink.grammar.compiler import GrammarCompiler

        self.compiler = GrammarCompiler(pieces, (eos,), max_states=1 << 20, max_cells=1 << 28)

    def compile(self, schema: dict):
        from blink.request import Constraint

        t = self.compiler._build(Constraint("json_schema", json.dumps(schema)))  # past the cache: a cold compile
        return {"states": t.num_states, "classes": t.num_classes, "bytes": t.nbytes}


class XGrammar:
    name = "xgrammar"

    def __init__(self, pieces: list[bytes | None], eos: int):
        import xgrammar as xgr

        encoded = [b if b is not None else b"" for b in pieces]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=len(pieces), stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict):
        return {"bytes": self.compiler.compile_json_schema(json.dumps(schema)).memory_size_bytes}


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Tokenizer, eos: int):
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
        self.tokenizer = llguidance.hf.from_tokenizer(fast, n_vocab=tok.get_vocab_size(), eos_token=eos)

    def compile(self, schema: dict):
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        matcher = llguidance.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return {"lazy": True}


def timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def corpus_times(lib: BlinkTables, folder: Path) -> None:
    from blink.grammar.schema import GrammarError

    times, refused = [], 0
    for path in sorted(folder.glob("*.json")):
        t0 = time.perf_counter()
        try:
            lib.compile(json.loads(path.read_text()))
            times.append(time.perf_counter() - t0)
        except GrammarError:
            refused += 1
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"{len(times)} compiled, {refused} refused; compile p50 {statistics.median(times) * 1e3:.0f} ms, "
          f"p99 {p99 * 1e3:.0f} ms, max {times[-1] * 1e3:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=None, help="run only the library whose name starts with this")
    ap.add_argument("--corpus", default=None, help="a folder of schemas: blink's compile times, p50 / p99")
    args = ap.parse_args()
    tok = train_vocab(args.vocab)
    eos = tok.token_to_id("<eos>")
    pieces = token_bytes(tok, tok.get_vocab_size())
    if args.corpus:
        return corpus_times(BlinkTables(pieces, eos), Path(args.corpus))
    makers = [(Outlines, pieces), (BlinkTables, pieces), (XGrammar, pieces), (LLGuidance, tok)]
    libs = [cls(arg, eos) for cls, arg in makers if args.only is None or cls.name.startswith(args.only)]
    print(f"vocab {tok.get_vocab_size()} tokens")
    for lib in libs:
        for name, schema in SCHEMAS.items():
            try:
                seconds, info = timed(lambda lib=lib, schema=schema: lib.compile(schema), args.repeat)
                print(f"{lib.name:14s} {name:18s} {seconds * 1e3:9.1f} ms  {info}")
            except Exception as e:  # noqa: BLE001 (a failure is a result here)
                print(f"{lib.name:14s} {name:18s} FAILED {type(e).__name__}: {str(e)[:80]}")
        ok = []
        for name, schema in KEYWORD_PROBES.items():
            try:
                lib.compile(schema)
                ok.append(name)
            except Exception:  # noqa: BLE001
                pass
        missing = sorted(set(KEYWORD_PROBES) - set(ok))
        print(f"{lib.name:14s} keywords: {len(ok)}/{len(KEYWORD_PROBES)} compile; refused: {missing}")


if __name__ == "__main__":
    main()
