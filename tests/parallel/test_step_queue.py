"""Host-mode TP's shared-memory step queue: every reader gets every message, in order, whole (also when
a message spans slots and the ring wraps), the writer waits for the slowest reader instead of
overwriting, and the step message survives the trip."""
from __future__ import annotations

import os
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.parallel.step_message import Admission, decode_step, encode_step, encode_stop, field_lengths
from blink.parallel.step_queue import StepQueue
from blink.request import SamplingParams

_names = iter(range(10**6))


@pytest.fixture
def make_queue():
    made = []

    def factory(readers: int, slots: int = 4, slot_bytes: int = 64):
        q = StepQueue.create(f"blink-test-stq-{os.getpid()}-{next(_names)}", readers, slots, slot_bytes)
        made.append(q)
        return q, [StepQueue.attach(q.name, r) for r in range(readers)]

    yield factory
    for q in made:
        q.close()
    assert all(not os.path.exists(f"/dev/shm/{q.name}") for q in made)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=12))
def test_two_readers_get_every_message_in_order(messages):
    writer = StepQueue.create(f"blink-test-stq-{os.getpid()}-{next(_names)}", 2, slots=3, slot_bytes=64)
    try:  # 300-byte messages span up to 5 slots of 64 bytes: chunking and wrap-around
        _check_two_readers(writer, messages)
    finally:
        writer.close()
    assert not os.path.exists(f"/dev/shm/{writer.name}")


def _check_two_readers(writer: StepQueue, messages: list[bytes]) -> None:
    readers = [StepQueue.attach(writer.name, r) for r in range(2)]
    got = [[], []]

    def read(k):
        got[k] = [readers[k].get(timeout=20) for _ in messages]

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for m in messages:
        writer.put(m, timeout=20)
    for t in threads:
        t.join(30)
    assert got == [messages, messages]
    for r in readers:
        r.close()


def test_writer_waits_for_the_slowest_reader(make_queue):
    writer, (reader,) = make_queue(1, slots=2, slot_bytes=8)
    writer.put(b"a")
    writer.put(b"b")
    with pytest.raises(TimeoutError, match="every reader"):
        writer.put(b"c", timeout=0.05)  # both slots unread: nothing is overwritten
    assert reader.get() == b"a"
    writer.put(b"c", timeout=1)
    assert [reader.get(), reader.get()] == [b"b", b"c"]
    with pytest.raises(TimeoutError, match="next step"):
        reader.get(timeout=0.05)


def test_a_full_ring_with_a_dead_reader_fails_at_once(make_queue):
    """The writer does not wait out its timeout for a reader that is gone: it raises the failure."""
    writer, (reader,) = make_queue(1, slots=2, slot_bytes=8)
    writer.put(b"a")
    writer.put(b"b")
    dead = RuntimeError("tensor-parallel rank 1 died (exit code -9)")
    with pytest.raises(RuntimeError, match="rank 1 died"):
        writer.put(b"c", timeout=None, failure=lambda: dead)  # without the failure it would wait forever
    assert [reader.get(), reader.get()] == [b"a", b"b"]  # the failed put overwrote nothing


def test_step_message_round_trip():
    t, s, mb = 8, 3, 4
    inputs = {name: torch.arange(n, dtype=torch.int64) + 7 for name, n in field_lengths(t, s, mb).items()}
    inputs["block_tables"] = inputs["block_tables"].view(s, mb).to(torch.int32)
    admissions = [Admission(1, SamplingParams(temperature=0.5, top_k=3), 9, [5, 6, 7], [8])]
    bucket, got, adm = decode_step(encode_step((t, s), inputs, admissions), mb)
    assert bucket == (t, s)
    assert all(torch.equal(got[k], inputs[k].to(torch.int64)) for k in inputs)
    assert adm[0].prompt_ids == [5, 6, 7] and adm[0].params.top_k == 3
    assert decode_step(encode_stop(), mb) is None
