"""The front end's side without a server: the arena mirror (503), releases, device-mode refusal."""
import asyncio
import gc
import json
from types import SimpleNamespace

import pytest

from blink.frontend.errors import APIError
from blink.frontend.protocol import CompletionRequest
from blink.frontend.structured import StructuredOutputs, constrain, constraint_of
from blink.grammar.arena import GRAMMAR_SLOTS
from blink.request import Constraint, SamplingParams
from blink.transport.layout import ENGINE_MODE_DEVICE, ENGINE_MODE_HOST


def mirror() -> StructuredOutputs:
    return StructuredOutputs(tokenizer=None, model="unused", arena_bytes=8 << 20)


def test_full_arena_is_a_503_and_shared_constraints_fit():
    so = mirror()
    for i in range(GRAMMAR_SLOTS):
        so.reserve(Constraint("regex", f"a{i}"))
    so.reserve(Constraint("regex", "a0"))  # already resident: shares its partition
    with pytest.raises(APIError) as e:
        so.reserve(Constraint("regex", "new"))
    assert e.value.status == 503
    so.release(Constraint("regex", "a1"))
    so.reserve(Constraint("regex", "new"))


def test_streams_give_their_reservation_back():
    so = mirror()
    c = Constraint("regex", "x")

    async def stream():
        yield 1

    async def consume():
        return [x async for x in so.hold(c, stream())]

    so.reserve(c)
    assert asyncio.run(consume()) == [1] and not so._in_flight
    so.reserve(c)
    never_run = so.hold(c, stream())
    del never_run
    gc.collect()
    assert not so._in_flight  # a stream dropped before it ran releases too


def test_device_mode_refuses_constraints():
    body = CompletionRequest(prompt="x", guided_regex="a+")
    state = SimpleNamespace(structured=mirror(), client=SimpleNamespace(control=SimpleNamespace(
        engine_mode=ENGINE_MODE_DEVICE)))
    with pytest.raises(APIError) as e:
        asyncio.run(constrain(state, body, [SamplingParams()]))
    assert e.value.status == 400 and "device mode" in e.value.message and e.value.param == "guided_regex"
    state.client.control.engine_mode = ENGINE_MODE_HOST  # text: no constraint, nothing to refuse
    assert asyncio.run(constrain(state, CompletionRequest(prompt="x", response_format={"type": "text"}), [])) is None


def test_field_spellings_agree():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    spellings = [{"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}},
                 {"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)}]
    found = {constraint_of(CompletionRequest(prompt="x", **s))[0] for s in spellings}
    assert len(found) == 1  # one cache key however it was asked for


def test_runaway_compile_is_refused_and_the_worker_replaced(monkeypatch):
    from blink.model.demo import ensure_default_model
    from blink.text import grammar_worker as worker
    from blink.text.tokenizer import load_tokenizer

    model = str(ensure_default_model())
    so = StructuredOutputs(load_tokenizer(model), model, 8 << 20)
    monkeypatch.setattr(worker, "COMPILE_TIMEOUT_S", 3.0)
    try:
        with pytest.raises(APIError) as e:  # a DFA of 2^26 states: never finishes in time
            asyncio.run(so.check(Constraint("regex", "(a|b)*a(a|b){26}"), "guided_regex"))
        assert e.value.status == 400 and "too complex" in e.value.message
        asyncio.run(so.check(Constraint("regex", "[a-c]{2}"), "guided_regex"))  # a fresh worker serves
    finally:
        so.close()
