"""Prompt records (prompt logprobs) through the egress and ingress rings: the rank rides in queue_us only on
prompt records, a finish with position -1 is no prompt record, and prompt_logprobs survives the descriptor."""
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.rings import EgressConsumer, EgressProducer, IngressConsumer, IngressProducer


def test_prompt_records_keep_their_rank_and_only_they_are_prompt_events(make_segment):
    seg = make_segment(egress_capacity=8)
    events = [TokenEvent(1, 42, -1, FinishReason.NONE, -1.5, [3, 42], [-0.25, -1.5], rank=2),
              TokenEvent(1, 43, -2, FinishReason.NONE, -0.5, [], [], rank=7),
              TokenEvent(1, 5, 0, FinishReason.NONE, -0.125, queue_us=1234),
              TokenEvent(2, -1, -1, FinishReason.ERROR)]  # the front end's own ERROR events use position -1
    assert EgressProducer(seg).push(events) == len(events)
    got = EgressConsumer(seg).poll()
    assert got == events
    assert [e.is_prompt for e in got] == [True, True, False, False]
    assert (got[0].rank, got[0].queue_us, got[2].rank, got[2].queue_us) == (2, 0, 0, 1234)


def test_prompt_logprobs_survive_the_descriptor(make_segment):
    seg = make_segment()
    producer = IngressProducer(seg)
    for rid, k in [(1, None), (2, 0), (3, 20)]:
        assert producer.submit(rid, [1, 2, 3], SamplingParams(prompt_logprobs=k), timeout=0)
    assert [item.params.prompt_logprobs for item in IngressConsumer(seg).poll(8)] == [None, 0, 20]
