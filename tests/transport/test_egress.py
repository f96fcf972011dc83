"""Egress ring: every token-record field survives, the ring wraps, full means refuse/wait, never loss."""
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blink.request import MAX_TOP_LOGPROBS, FinishReason, TokenEvent
from blink.transport.rings import EgressConsumer, EgressProducer


def event(i: int) -> TokenEvent:
    return TokenEvent(req_id=i, token_id=i % 50_000, position=i // 7)


def test_record_round_trip_keeps_every_field(make_segment):
    seg = make_segment(egress_capacity=8)
    events = [
        TokenEvent(2**64 - 1, 2**31 - 1, 2**31 - 1, FinishReason.NONE, -0.5,
                   list(range(MAX_TOP_LOGPROBS)), [-k / 4 for k in range(MAX_TOP_LOGPROBS)]),
        TokenEvent(3, 0, 0, FinishReason.STOP, 0.0, [9], [-0.125]),
        TokenEvent(4, -1, 17, FinishReason.ABORT),  # a finish without a token
        TokenEvent(5, 12, 1, FinishReason.LENGTH, -3.25),
        TokenEvent(6, -1, 0, FinishReason.ERROR),
    ]
    assert EgressProducer(seg).push(events) == len(events)
    assert EgressConsumer(seg).poll() == events
    assert EgressConsumer(seg).poll() == []


def test_full_ring_refuses_the_rest_and_overwrites_nothing(make_segment):
    seg = make_segment(egress_capacity=4)
    producer, consumer = EgressProducer(seg), EgressConsumer(seg)
    assert producer.push([event(i) for i in range(6)], timeout=0) == 4
    assert producer.push([event(9)], timeout=0.01) == 0
    assert consumer.poll(max_items=3) == [event(i) for i in range(3)]
    assert producer.push([event(i) for i in range(4, 8)], timeout=0) == 3
    assert consumer.poll() == [event(i) for i in (3, 4, 5, 6)]


def test_blocking_push_waits_for_the_consumer(make_segment):
    seg = make_segment(egress_capacity=3)
    producer, consumer = EgressProducer(seg), EgressConsumer(seg)
    events = [event(i) for i in range(100)]
    thread = threading.Thread(target=lambda: producer.push(events))
    thread.start()
    received = []
    while len(received) < len(events):
        received += consumer.wait(timeout=5, max_items=2)
    thread.join(timeout=10)
    assert received == events and not thread.is_alive()


def test_wait_times_out_empty(make_segment):
    seg = make_segment()
    assert EgressConsumer(seg).wait(timeout=0.005) == []
    assert EgressConsumer(seg).wait(timeout=0) == []


@pytest.mark.parametrize("bad, match", [
    (TokenEvent(1, 2, 3, top_ids=list(range(21)), top_logprobs=[0.0] * 21), "top_ids"),
    (TokenEvent(1, 2, 3, top_ids=[1, 2], top_logprobs=[0.0]), "top_ids"),
    (TokenEvent(-1, 2, 3), "req_id"),
    (TokenEvent(1, 2**31, 3), "token_id"),
])
def test_unsendable_events_raise_value_error(make_segment, bad, match):
    seg = make_segment()
    with pytest.raises(ValueError, match=match):
        EgressProducer(seg).push([event(0), bad])
    assert EgressConsumer(seg).poll() == []


# make_segment is a factory: each example gets its own segment, so sharing the fixture is safe.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, 9), data=st.data())
def test_ring_wrap_preserves_order(make_segment, capacity, data):
    seg = make_segment(egress_capacity=capacity)
    producer, consumer = EgressProducer(seg), EgressConsumer(seg)
    batches = data.draw(st.lists(st.integers(0, 2 * capacity), min_size=1, max_size=20))
    sent, received, next_id = [], [], 0
    for size in batches:
        batch = [event(next_id + k) for k in range(size)]
        pushed = producer.push(batch, timeout=0)
        assert pushed == min(size, capacity - len(sent) + len(received))
        sent += batch[:pushed]
        next_id += pushed
        received += consumer.poll(max_items=data.draw(st.integers(1, capacity)))
    received += consumer.poll()
    assert received == sent
