"""Two processes through tiny rings: a fast producer against a slow consumer, so the ring is full most of
the time. Nothing may be lost, duplicated or reordered."""
import multiprocessing
import os
import time

import pytest

from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.rings import EgressConsumer, EgressProducer, IngressConsumer, IngressProducer
from blink.transport.shm import SHM_DIR, Segment

pytestmark = pytest.mark.slow  # spawns processes

NUM_ITEMS = 10_000


def request_for(i: int) -> tuple[list[int], SamplingParams]:
    prompt = [i * 7 + k for k in range(1 + i % 5)]
    logit_bias = {i % 13: 1.0} if i % 3 == 0 else {}
    return prompt, SamplingParams(max_tokens=1 + i % 100, seed=i, logit_bias=logit_bias)


def event_for(i: int) -> TokenEvent:
    finish = FinishReason.LENGTH if i % 11 == 0 else FinishReason.NONE
    return TokenEvent(req_id=i // 3, token_id=i, position=i % 3, finish_reason=finish, logprob=-(i % 8) / 2)


def produce_requests(name: str) -> None:
    seg = Segment.attach(name)
    producer = IngressProducer(seg)
    for i in range(NUM_ITEMS):
        if i % 97 == 0:
            assert producer.abort(i, timeout=60)
        prompt, params = request_for(i)
        assert producer.submit(i, prompt, params, timeout=60)
    seg.close()


def produce_events(name: str) -> None:
    seg = Segment.attach(name)
    producer = EgressProducer(seg)
    i = 0
    while i < NUM_ITEMS:  # steps of varying size, as an engine emits them
        batch = [event_for(k) for k in range(i, min(i + 1 + i % 6, NUM_ITEMS))]
        assert producer.push(batch, timeout=60) == len(batch)
        i += len(batch)
    seg.close()


def run_child(target, name: str) -> multiprocessing.Process:
    child = multiprocessing.get_context("spawn").Process(target=target, args=(name,), daemon=True)
    child.start()
    return child


def slow_down() -> None:
    time.sleep(100e-6)  # far slower than the producer: it finds the ring full most of the time


def test_ingress_across_processes_under_backpressure(make_segment):
    seg = make_segment(ingress_capacity=4, arena_capacity=24)
    consumer = IngressConsumer(seg)
    child = run_child(produce_requests, seg.name)
    expected = []
    for i in range(NUM_ITEMS):
        if i % 97 == 0:
            expected.append(("abort", i, []))
        expected.append(("request", i, request_for(i)[0]))
    received, seeds = [], []
    deadline = time.monotonic() + 120
    while len(received) < len(expected) and time.monotonic() < deadline and (child.is_alive() or
                                                                               consumer.descriptors.used()):
        for item in consumer.poll(max_items=2):
            received.append((item.kind, item.req_id, item.prompt_ids))
            if item.kind == "request":
                seeds.append(item.params.seed)
                assert item.params == request_for(item.req_id)[1]
        slow_down()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert received == expected
    assert seeds == list(range(NUM_ITEMS))
    assert consumer.poll() == []
    assert os.path.exists(os.path.join(SHM_DIR, seg.name))  # the child attached, it did not unlink


def test_egress_across_processes_under_backpressure(make_segment):
    seg = make_segment(egress_capacity=4)
    consumer = EgressConsumer(seg)
    child = run_child(produce_events, seg.name)
    received = []
    deadline = time.monotonic() + 120
    while len(received) < NUM_ITEMS and time.monotonic() < deadline and (child.is_alive()
                                                                         or consumer.ring.used()):
        received += consumer.wait(timeout=0.1, max_items=2)
        slow_down()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert received == [event_for(i) for i in range(NUM_ITEMS)]
    assert consumer.poll() == []
