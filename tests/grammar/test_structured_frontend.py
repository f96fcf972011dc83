"""The front end's side without a server: the arena mirror (a wait, then 503), releases, device mode's staging."""
import asyncio
import gc
import json
from types import SimpleNamespace

import pytest

from blink.frontend.constraint_fields import constraint_of
from blink.frontend.errors import APIError
from blink.frontend.protocol import CompletionRequest
from blink.frontend.structured import StructuredOutputs, constrain
from blink.grammar.arena import GRAMMAR_SLOTS
from blink.request import Constraint, SamplingParams
from blink.transport.layout import ENGINE_MODE_DEVICE


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


def test_a_full_arena_makes_a_request_wait_for_a_partition(monkeypatch):
    """A 17th distinct constraint waits (as vLLM queues it) and runs once a stream gives a partition back; past
    the wait it is the 503."""
    from blink.frontend import structured as module

    so = mirror()
    for i in range(GRAMMAR_SLOTS):
        so.reserve(Constraint("regex", f"a{i}"))

    async def check(c, param, want_tables=False):
        return None

    so.check = check
    state = SimpleNamespace(structured=so, client=SimpleNamespace(control=SimpleNamespace(engine_mode=0)))
    params = [SamplingParams(), SamplingParams()]

    async def main():
        waiting = asyncio.ensure_future(constrain(state, CompletionRequest(prompt="x", guided_regex="b+"), params))
        await asyncio.sleep(0.1)
        assert not waiting.done() and so.waiting == 1  # the arena is full: it waits (the gauge says so), no 503
        so.release(Constraint("regex", "a3"))
        return await asyncio.wait_for(waiting, 2.0)

    c = asyncio.run(main())
    assert so.waiting == 0
    assert so._in_flight[c] == 2  # both choices hold the partition it got
    monkeypatch.setattr(module, "ARENA_WAIT_S", 0.05)
    with pytest.raises(APIError) as e:
        asyncio.run(constrain(state, CompletionRequest(prompt="x", guided_regex="c+"), [SamplingParams()]))
    assert e.value.status == 503 and "grammar arena partitions" in e.value.message


def test_device_mode_stages_the_tables_for_the_gpu(monkeypatch):
    """Device mode: the front end compiles with tables, writes them into a staging slot (once for n choices)
    and holds it per choice until the stream ends; a submitted request holds it until its last record."""
    import os

    import numpy as np

    from blink.grammar.tables import GrammarTables
    from blink.transport.grammar_staging import GrammarStaging
    from blink.transport.layout import SegmentLayout
    from blink.transport.shm import Segment

    seg = Segment.create(f"blink-so-{os.getpid()}", SegmentLayout(8, 1024, 8, GRAMMAR_SLOTS, 64))
    try:
        seg.control.engine_mode, seg.control.vocab_size = ENGINE_MODE_DEVICE, 10
        so = mirror()
        t = GrammarTables(np.arange(10, dtype=np.int32) % 3, np.array([[-1, 0, 1], [-1, 1, -1]], np.int32))

        async def check(c, param, want_tables=False):
            assert want_tables
            return t

        so.check = check
        state = SimpleNamespace(structured=so, client=SimpleNamespace(control=seg.control, segment=seg))
        params = [SamplingParams(), SamplingParams()]
        c = asyncio.run(constrain(state, CompletionRequest(prompt="x", guided_regex="a+"), params))
        staging = GrammarStaging.of(seg)
        slot = staging.slot_of(c)
        assert all(p.constraint == c for p in params) and slot is not None
        assert (staging.words[slot, :10] == t.token_class).all()
        assert (staging.words[slot, 10:16] == t.next_state.ravel()).all()
        assert staging.held_keys() == {c}
        so.release(c)
        so.release(c)  # both choices' streams ended (never submitted): nothing holds the slot
        assert staging.held_keys() == set()
        for i in range(GRAMMAR_SLOTS):  # every slot held by others: a 503 after the wait
            staging.reserve(Constraint("regex", f"o{i}"), t.token_class, t.next_state)
        from blink.frontend import structured as module
        monkeypatch.setattr(module, "ARENA_WAIT_S", 0.05)
        with pytest.raises(APIError) as e:
            asyncio.run(constrain(state, CompletionRequest(prompt="x", guided_regex="b+"), [SamplingParams()]))
        assert e.value.status == 503
    finally:
        seg.close()
        seg.unlink()


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
