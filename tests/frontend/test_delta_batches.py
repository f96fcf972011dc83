"""A stream that falls behind its records catches up in one delta: every record already queued goes into
it (text, token count, logprobs), so a starved front end writes one chunk, not one a token. Records that
come one at a time still make one delta each, and a stop string inside a batch ends it where it matched.
With --stream-interval N the first text still goes at once, then one delta per N tokens, and the last at the finish."""
from __future__ import annotations

import asyncio

from blink.frontend.generation import GenerationContext, generate
from blink.frontend.metrics import FrontendMetrics
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.text.tokenizer import load_tokenizer

TOKENS = list(range(5, 13))  # the preset's word-level tokenizer: "w5 w6 ... w12"


class QueueClient:
    def __init__(self):
        self.queue: asyncio.Queue | None = None
        self.aborted: list[int] = []

    def add_request(self, prompt_ids, params):
        self.queue = asyncio.Queue()
        return 1, self.queue

    def abort(self, req_id):
        self.aborted.append(req_id)

    def put(self, position: int, last: bool) -> None:
        reason = FinishReason.LENGTH if last else FinishReason.NONE
        self.queue.put_nowait(TokenEvent(1, TOKENS[position], position, reason, logprob=-0.5 - position,
                                         top_ids=[TOKENS[position]], top_logprobs=[-0.5 - position]))


def _generate(client, stream_interval=1, **params):
    ctx = GenerationContext(client, load_tokenizer("llama3.2-1b"), FrontendMetrics(None, "m"), stream_interval)
    return generate(ctx, [1, 2], SamplingParams(max_tokens=len(TOKENS), **params))


def test_records_queued_before_the_stream_reads_make_one_delta():
    client = QueueClient()

    async def main():
        stream = _generate(client, logprobs=1)
        for i in range(len(TOKENS)):
            client.put(i, last=i == len(TOKENS) - 1)
        return [delta async for delta in stream]

    deltas = asyncio.run(main())
    assert len(deltas) == 1
    (delta,) = deltas
    assert delta.text == "".join(f" w{t}" for t in TOKENS)
    assert delta.num_tokens == len(TOKENS) and delta.finish_reason == "length"
    assert [lp.token_id for lp in delta.logprobs] == TOKENS
    assert [lp.logprob for lp in delta.logprobs] == [-0.5 - i for i in range(len(TOKENS))]


def test_records_that_come_one_at_a_time_make_one_delta_each():
    client = QueueClient()

    async def main():
        stream = _generate(client)
        deltas = []
        for i in range(len(TOKENS)):
            client.put(i, last=i == len(TOKENS) - 1)
            deltas.append(await anext(stream))
        return deltas

    deltas = asyncio.run(main())
    assert [d.num_tokens for d in deltas] == list(range(1, len(TOKENS) + 1))
    assert "".join(d.text for d in deltas) == "".join(f" w{t}" for t in TOKENS)
    assert [d.finish_reason for d in deltas] == [None] * (len(TOKENS) - 1) + ["length"]


def test_a_stop_string_inside_a_batch_ends_the_delta_there_and_aborts():
    client = QueueClient()

    async def main():
        stream = _generate(client, stop=["w8"])
        for i in range(len(TOKENS)):
            client.put(i, last=i == len(TOKENS) - 1)
        return [delta async for delta in stream]

    deltas = asyncio.run(main())
    assert len(deltas) == 1
    assert deltas[0].text == " w5 w6 w7 "
    assert deltas[0].finish_reason == "stop" and deltas[0].stop_reason == "w8"
    assert deltas[0].num_tokens == 4  # the records after the match are not counted
    assert client.aborted == [1]


def _one_at_a_time(client, count: int, **kwargs) -> list:
    """Feed `count` records one by one; collect the deltas each one releases (none until a delta is due)."""
    async def main():
        stream = _generate(client, **kwargs)
        deltas, pending = [], None
        for i in range(count):
            client.put(i, last=i == count - 1)
            pending = pending or asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # let the stream take the record
            await asyncio.sleep(0)
            if pending.done():
                deltas.append((i + 1, pending.result()))
                pending = None
                if deltas[-1][1].finish_reason is not None:
                    break
        if pending is not None:
            deltas.append((count, await pending))
        return deltas

    return asyncio.run(main())


def test_a_stream_interval_sends_the_first_token_at_once_then_one_delta_per_interval():
    client = QueueClient()
    deltas = _one_at_a_time(client, len(TOKENS), stream_interval=3, logprobs=1)
    # tokens 1 | 2 3 4 | 5 6 7 | 8 (the finish): released as the 1st, 4th, 7th and 8th record came in
    assert [(seen, d.num_tokens) for seen, d in deltas] == [(1, 1), (4, 4), (7, 7), (8, 8)]
    assert [d.text for _, d in deltas] == [" w5", " w6 w7 w8", " w9 w10 w11", " w12"]
    assert [d.finish_reason for _, d in deltas] == [None, None, None, "length"]
    assert [[lp.token_id for lp in d.logprobs] for _, d in deltas] == [TOKENS[:1], TOKENS[1:4], TOKENS[4:7], TOKENS[7:]]


def test_a_stream_interval_of_one_is_one_delta_a_token():
    client = QueueClient()
    deltas = _one_at_a_time(client, len(TOKENS), stream_interval=1)
    assert [seen for seen, _ in deltas] == list(range(1, len(TOKENS) + 1))


def test_a_stop_string_ends_a_held_delta_at_once():
    client = QueueClient()
    deltas = _one_at_a_time(client, len(TOKENS), stream_interval=8, stop=["w7"])
    assert [(seen, d.text) for seen, d in deltas] == [(1, " w5"), (3, " w6 ")]
    assert deltas[-1][1].finish_reason == "stop" and client.aborted == [1]
