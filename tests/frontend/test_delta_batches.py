"""A stream that falls behind its records catches up in one delta: every record already queued goes into
it (text, token count, logprobs), so a starved front end writes one chunk, not one a token. Records that
come one at a time still make one delta each, and a stop string inside a batch ends it where it matched."""
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


def _generate(client, **params):
    ctx = GenerationContext(client, load_tokenizer("llama3.2-1b"), FrontendMetrics(None, "m"))
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
