"""generate() submits at once (the engine works while the response starts) and a stream dropped without
ever running is aborted, so no engine request outlives its HTTP request."""
from __future__ import annotations

import asyncio
import gc

from blink.frontend.generation import GenerationContext, collect, generate
from blink.frontend.metrics import FrontendMetrics
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.text.tokenizer import load_tokenizer


class RecordingClient:
    """The EngineClient calls generate makes; each request gets one finished token queued at once."""

    def __init__(self):
        self.submitted: list[int] = []
        self.aborted: list[int] = []
        self.queues: dict[int, asyncio.Queue] = {}

    def add_request(self, prompt_ids, params):
        req_id = len(self.submitted) + 1
        self.submitted.append(req_id)
        queue = self.queues[req_id] = asyncio.Queue()
        queue.put_nowait(TokenEvent(req_id, 5, 0, FinishReason.LENGTH))
        return req_id, queue

    def abort(self, req_id):
        if self.queues.pop(req_id, None) is not None:  # as EngineClient: finished requests are no-ops
            self.aborted.append(req_id)


def _context(client) -> GenerationContext:
    return GenerationContext(client, load_tokenizer("llama3.2-1b"), FrontendMetrics(None, "m"))


def test_submits_before_the_stream_runs_and_a_consumed_stream_is_not_aborted():
    client = RecordingClient()

    async def main():
        stream = generate(_context(client), [1, 2, 3], SamplingParams(max_tokens=1))
        assert client.submitted == [1]  # before any iteration
        delta = await collect(stream)
        client.queues.pop(1)  # finished, as EngineClient._dispatch does
        del stream
        gc.collect()
        await asyncio.sleep(0)
        return delta

    delta = asyncio.run(main())
    assert delta.finish_reason == "length" and delta.num_tokens == 1
    assert client.aborted == []


def test_a_stream_dropped_unstarted_is_aborted():
    client = RecordingClient()

    async def main():
        streams = [generate(_context(client), [1, 2], SamplingParams(max_tokens=4)) for _ in range(2)]
        assert client.submitted == [1, 2]
        del streams  # as a response that never started its body (the client left)
        await asyncio.sleep(0)  # the aborts go through the loop
        await asyncio.sleep(0)

    asyncio.run(main())
    assert sorted(client.aborted) == [1, 2]
