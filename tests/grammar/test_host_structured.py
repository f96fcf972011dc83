"""Host engine end to end with the demo model (random weights): the grammar alone makes outputs valid,
through chunked prefill, preemption (re-admission walks the automaton), n > 1 and seeded sampling."""
import json
import re
import time

import jsonschema
import pytest
from tokenizers import Tokenizer

from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.model.demo import ensure_default_model
from blink.request import Constraint, FinishReason, SamplingParams

SCHEMAS = [
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "n": {"type": "integer", "minimum": -3, "maximum": 250}},
     "required": ["color", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                               "maxItems": 3},
                                      "ok": {"type": "boolean"}},
     "required": ["tags", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "minLength": 1, "maxLength": 6}},
        "required": ["id", "name"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
]


def strict_json(text: str):
    """json.loads that also refuses raw control characters in strings (strict=True is the default)."""
    return json.loads(text, strict=True)


@pytest.fixture(scope="module")
def demo():
    path = ensure_default_model()
    return Tokenizer.from_file(str(path / "tokenizer.json"))


def engine(**kw) -> HostEngine:
    args = dict(device="cpu", dtype="float32", max_num_seqs=6, max_num_batched_tokens=32, num_kv_blocks=64,
                block_size=4, grammar_arena_mb=8)
    args.update(kw)
    return HostEngine(EngineArgs(**args))


def run(eng: HostEngine, requests: dict[int, tuple[list[int], SamplingParams]]):
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    tokens, reasons = {rid: [] for rid in requests}, {}
    deadline = time.monotonic() + 600  # an anti-stall bound only (compiles run in a worker process)
    while eng.has_unfinished():
        assert time.monotonic() < deadline, "the engine stalled"
        for e in eng.step():
            if e.token_id >= 0:
                tokens[e.req_id].append(e.token_id)
            if e.finish_reason != FinishReason.NONE:
                reasons[e.req_id] = e.finish_reason
    return tokens, reasons


def text_of(demo, eng, ids):
    return demo.decode([t for t in ids if t not in eng.m.eos_token_ids])


def test_json_schemas_validate(demo):
    eng = engine()
    prompt = list(range(3, 60))  # longer than the token budget: chunked prefill
    requests = {}
    for i, schema in enumerate(SCHEMAS):
        for j in range(2):
            params = SamplingParams(temperature=1.0, seed=10 * i + j, max_tokens=120,
                                    constraint=Constraint("json_schema", json.dumps(schema)))
            requests[10 * i + j] = (prompt, params)
    tokens, reasons = run(eng, requests)
    for rid, ids in tokens.items():
        assert reasons[rid] == FinishReason.STOP, (rid, text_of(demo, eng, ids))
        jsonschema.validate(strict_json(text_of(demo, eng, ids)), SCHEMAS[rid // 10])
    assert not eng.constraints.arena.resident  # every partition was given back


def test_choice_regex_and_json_object(demo):
    eng = engine()
    choices = ["alpha", "beta gamma", "delta"]
    requests = {
        1: ([5, 6, 7], SamplingParams(temperature=1.0, seed=1, max_tokens=20,
                                      constraint=Constraint("choice", json.dumps(choices)))),
        2: ([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=20,
                                      constraint=Constraint("regex", r"[A-Z][a-z]{2,5}-[0-9]{2}"))),
        3: ([8, 9], SamplingParams(temperature=0.8, seed=3, max_tokens=200, constraint=Constraint("json_object"))),
    }
    tokens, reasons = run(eng, requests)
    assert reasons[1] == FinishReason.STOP and text_of(demo, eng, tokens[1]) in choices
    assert reasons[2] == FinishReason.STOP and re.fullmatch(r"[A-Z][a-z]{2,5}-[0-9]{2}", text_of(demo, eng, tokens[2]))
    if reasons[3] == FinishReason.STOP:  # an object may run past max_tokens; a finished one is JSON
        assert isinstance(strict_json(text_of(demo, eng, tokens[3])), dict)
    else:
        assert reasons[3] == FinishReason.LENGTH


def test_abort_while_compiling():
    eng = engine()
    eng.add_request(1, [1, 2], SamplingParams(max_tokens=5, constraint=Constraint("regex", "[a-z]{2,40}x")))
    eng.abort_request(1)
    events = eng.step()
    assert [(e.req_id, e.finish_reason) for e in events] == [(1, FinishReason.ABORT)] and not eng.has_unfinished()


def test_preemption_and_seeds_keep_the_grammar(demo):
    schema = SCHEMAS[2]
    c = Constraint("json_schema", json.dumps(schema))
    requests = {rid: (list(range(10, 30)), SamplingParams(temperature=1.0, seed=rid, max_tokens=60, constraint=c))
                for rid in range(5)}
    roomy_tokens, _ = run(engine(), requests)
    tight = engine(num_kv_blocks=22)  # too few blocks for all five: the newest get preempted
    tokens, reasons = run(tight, requests)
    assert tight.scheduler.num_preemptions > 0
    for rid, ids in tokens.items():
        assert reasons[rid] == FinishReason.STOP
        jsonschema.validate(strict_json(text_of(demo, tight, ids)), schema)
        assert ids == roomy_tokens[rid]  # seeded: the same tokens with or without preemption


def test_refusals_end_the_request_and_the_engine_goes_on():
    eng = engine(grammar_arena_mb=1)
    too_large = SamplingParams(max_tokens=5, constraint=Constraint("regex", "[a-z]{3000}"))
    fine = SamplingParams(max_tokens=5, temperature=0, constraint=Constraint("regex", "[a-z]{3}"))
    tokens, reasons = run(eng, {1: ([1, 2], too_large), 2: ([1, 2], fine), 3: ([1, 2], SamplingParams(max_tokens=2))})
    assert reasons == {1: FinishReason.ERROR, 2: FinishReason.STOP, 3: FinishReason.LENGTH} and not tokens[1]
    assert not eng.constraints.arena.resident
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, constraint=Constraint("json_object"))
