"""Ingress ring: every descriptor field survives, arena and ring wrap, full means refuse/wait, never loss."""
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blink.request import SamplingParams
from blink.transport.layout import FLAG_IGNORE_EOS, KIND_ABORT, KIND_REQUEST
from blink.transport.rings import IngressConsumer, IngressProducer


def full_params() -> SamplingParams:
    """Every field away from its default, with values exact in float32."""
    return SamplingParams(
        temperature=0.75, top_p=0.875, top_k=40, min_p=0.0625, presence_penalty=-1.5, frequency_penalty=0.25,
        repetition_penalty=1.125, logit_bias={17: -100.0, 3: 2.5, 99_999: 0.125}, seed=(1 << 63) + 12345,
        max_tokens=4000, min_tokens=7, stop=["never sent"], stop_token_ids=list(range(100, 116)),
        ignore_eos=True, logprobs=20,
    )


def test_request_round_trip_keeps_every_field(make_segment):
    seg = make_segment()
    params = full_params()
    assert IngressProducer(seg).submit(2**64 - 1, [5, 0, 2**31 - 1, 42], params)
    [item] = IngressConsumer(seg).poll()
    assert (item.kind, item.req_id, item.prompt_ids) == ("request", 2**64 - 1, [5, 0, 2**31 - 1, 42])
    expected = SamplingParams(**{**params.__dict__, "stop": []})  # stop strings stay in the front end
    assert item.params == expected


def test_descriptor_bytes_are_what_the_engine_expects(make_segment):
    seg = make_segment()
    producer = IngressProducer(seg)
    producer.submit(9, [1, 2, 3], SamplingParams(logit_bias={4: 1.0}, logprobs=None, ignore_eos=True))
    producer.abort(10)
    first, second = producer.descriptors.records[:2]
    assert first["kind"] == KIND_REQUEST and first["num_logprobs"] == -1 and first["flags"] == FLAG_IGNORE_EOS
    arena_fields = ("arena_offset", "prompt_len", "num_logit_bias", "arena_len")
    assert [int(first[name]) for name in arena_fields] == [0, 3, 1, 5]
    arena = producer.arena.records
    assert arena[:4].tolist() == [1, 2, 3, 4] and arena[4:5].view(np.float32)[0] == 1.0
    assert second["kind"] == KIND_ABORT and second["req_id"] == 10 and second["arena_len"] == 0


def test_missing_seed_becomes_a_random_63_bit_seed(make_segment):
    seg = make_segment()
    producer = IngressProducer(seg)
    for req_id in range(3):
        producer.submit(req_id, [1], SamplingParams(seed=None, logprobs=0))
    items = IngressConsumer(seg).poll()
    seeds = [item.params.seed for item in items]
    assert all(0 <= seed < 2**63 for seed in seeds) and len(set(seeds)) == 3
    assert [item.params.logprobs for item in items] == [0, 0, 0]


def test_abort_round_trip_keeps_order_with_requests(make_segment):
    seg = make_segment()
    producer, consumer = IngressProducer(seg), IngressConsumer(seg)
    producer.submit(1, [7], SamplingParams())
    producer.abort(1)
    producer.submit(2, [8], SamplingParams())
    items = consumer.poll()
    assert [(i.kind, i.req_id, i.prompt_ids) for i in items] == [("request", 1, [7]), ("abort", 1, []),
                                                                  ("request", 2, [8])]
    assert items[1].params is None


def test_full_ring_refuses_and_overwrites_nothing(make_segment):
    seg = make_segment(ingress_capacity=3, arena_capacity=1000)
    producer, consumer = IngressProducer(seg), IngressConsumer(seg)
    assert all(producer.submit(i, [i] * 4, SamplingParams()) for i in range(3))
    assert not producer.submit(3, [3], SamplingParams(), timeout=0)
    assert not producer.submit(3, [3], SamplingParams(), timeout=0.01)
    assert not producer.abort(3, timeout=0)
    assert [(i.req_id, i.prompt_ids) for i in consumer.poll()] == [(i, [i] * 4) for i in range(3)]
    assert producer.submit(3, [3], SamplingParams(), timeout=0)


def test_full_arena_refuses_and_overwrites_nothing(make_segment):
    seg = make_segment(ingress_capacity=8, arena_capacity=10)
    producer, consumer = IngressProducer(seg), IngressConsumer(seg)
    assert producer.submit(0, list(range(6)), SamplingParams())
    assert not producer.submit(1, list(range(5)), SamplingParams(), timeout=0)  # 4 slots left
    assert producer.abort(0, timeout=0)  # aborts need no arena
    assert [(i.kind, i.prompt_ids) for i in consumer.poll()] == [("request", list(range(6))), ("abort", [])]
    assert producer.submit(1, list(range(10)), SamplingParams(), timeout=0)  # wraps around the arena end
    assert consumer.poll()[0].prompt_ids == list(range(10))


def test_blocking_submit_waits_for_the_consumer(make_segment):
    seg = make_segment(ingress_capacity=2, arena_capacity=16)
    producer, consumer = IngressProducer(seg), IngressConsumer(seg)
    sent = []

    def produce():
        for i in range(50):
            assert producer.submit(i, [i, i + 1], SamplingParams())
            sent.append(i)

    thread = threading.Thread(target=produce)
    thread.start()
    received = []
    while len(received) < 50:
        received += [item.req_id for item in consumer.wait(timeout=5, max_items=1)]
    thread.join(timeout=10)
    assert received == sent == list(range(50))


@pytest.mark.parametrize("prompt, params, match", [
    (list(range(65)), SamplingParams(), "does not fit"),
    (list(range(60)), SamplingParams(logit_bias={i: 1.0 for i in range(3)}), "does not fit"),
    ([2**31], SamplingParams(), "prompt token id"),
    ([-(2**31) - 1], SamplingParams(), "prompt token id"),
    ([1], SamplingParams(max_tokens=2**32), "max_tokens"),
    ([1], SamplingParams(top_p=1e-50), "float32"),
])
def test_unsendable_requests_raise_value_error(make_segment, prompt, params, match):
    seg = make_segment(arena_capacity=64)
    producer = IngressProducer(seg)
    with pytest.raises(ValueError, match=match):
        producer.submit(1, prompt, params)
    with pytest.raises(ValueError, match="req_id"):
        producer.submit(-1, [1], SamplingParams())
    params = SamplingParams()
    params.stop_token_ids = list(range(17))  # changed after validation: submit validates again
    with pytest.raises(ValueError, match="stop_token_ids"):
        producer.submit(1, [1], params)
    assert IngressConsumer(seg).poll() == []  # nothing half-sent


# make_segment is a factory: each example gets its own segment, so sharing the fixture is safe.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ingress_capacity=st.integers(1, 5), arena_capacity=st.integers(1, 40), data=st.data())
def test_arena_and_ring_wrap_preserve_every_prompt(make_segment, ingress_capacity, arena_capacity, data):
    seg = make_segment(ingress_capacity=ingress_capacity, arena_capacity=arena_capacity)
    producer, consumer = IngressProducer(seg), IngressConsumer(seg)
    lengths = data.draw(st.lists(st.integers(0, arena_capacity), min_size=1, max_size=30))
    pending, received, expected = list(enumerate(lengths)), [], []
    while pending:
        req_id, length = pending[0]
        prompt = [req_id * 1000 + k for k in range(length)]
        if producer.submit(req_id, prompt, SamplingParams(seed=req_id), timeout=0):
            expected.append((req_id, prompt, req_id))
            pending.pop(0)
        else:  # full: drain a random number of items, as an engine would
            batch = consumer.poll(max_items=data.draw(st.integers(1, ingress_capacity)))
            assert batch, "the producer was refused although nothing was queued"
            received += [(i.req_id, i.prompt_ids, i.params.seed) for i in batch]
    received += [(i.req_id, i.prompt_ids, i.params.seed) for i in consumer.poll()]
    assert received == expected
