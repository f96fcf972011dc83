"""One engine request as a stream of text deltas: detokenization, stop strings, logprobs, abort.

A request is submitted when its stream is created, so the engine works while the response starts; it is
aborted on the engine whenever its consumer stops early: a stop string matched, the client went away (the
task is cancelled), anything else raised, or the stream was dropped without ever running.
"""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from blink.frontend.engine_client import EngineClient, EngineUnavailable
from blink.frontend.errors import APIError
from blink.frontend.metrics import FrontendMetrics, RequestTimer
from blink.frontend.prompt_logprobs import PromptLogprobEntry
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.text.detokenizer import IncrementalDetokenizer, StopStringMatcher
from blink.text.tokenizer import ModelTokenizer


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Delta:
    """New output of one choice. `finish_reason` is set on its last delta (OpenAI's string)."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_tokens: int = 0  # generated tokens so far (usage)
    cached_tokens: int = 0  # prompt tokens found in the engine's prefix cache (usage.prompt_tokens_details)
    error: bool = False  # the engine refused or lost the request
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it
    prompt_logprobs: list[PromptLogprobEntry] | None = None  # the first delta only: prompt tokens 1, 2, ...


@dataclass
class GenerationContext:
    client: EngineClient
    tokenizer: ModelTokenizer
    metrics: FrontendMetrics
    stream_interval: int = 1  # --stream-interval: after the first delta, one per this many tokens (and the last)


def generate(ctx: GenerationContext, prompt_ids: list[int], params: SamplingParams,
             skip_special_tokens: bool = True, include_stop: bool = False,
             arrival: float | None = None) -> AsyncIterator[Delta]:
    """Submit the request now (APIError 503/400 if it cannot be) and return its deltas: text (or logprobs)
    as it becomes final; the last one has finish_reason.

    `include_stop` (include_stop_str_in_output) keeps the stop string, or the stop token's text, in it.
    `arrival`: the HTTP request's arrival (serving.arrival), where its TTFT and E2E clocks start.
    Called on the loop, as everything that touches the ingress ring.
    """
    timer = RequestTimer(ctx.metrics, len(prompt_ids), params.max_tokens, arrival)
    try:
        req_id, queue = ctx.client.add_request(prompt_ids, params)
    except EngineUnavailable as e:
        raise APIError(503, str(e)) from None
    except ValueError as e:  # what the ring cannot carry (the API checks should have caught it)
        raise APIError(400, str(e)) from None
    started = [False]  # once it runs, its own `finally` aborts it when it stops early
    stream = _deltas(ctx, req_id, queue, timer, prompt_ids, params, skip_special_tokens, include_stop, started)
    # Dropped without ever running (a later choice failed to submit, the client left before the body
    # started): abort it, through the loop, as a garbage collection may run this on the egress reader's thread.
    weakref.finalize(stream, _abort_unstarted, asyncio.get_running_loop(), ctx.client, req_id, started)
    return stream


def _abort_unstarted(loop: asyncio.AbstractEventLoop, client: EngineClient, req_id: int, started: list[bool]) -> None:
    if not started[0] and not loop.is_closed():
        loop.call_soon_threadsafe(client.abort, req_id)


class _Records:
    """One request's records turned into output: its text (detokenized, stop strings cut), token count, cached
    prompt tokens, logprobs, prompt logprobs and the stop token or string that ended it."""

    def __init__(self, tokenizer: ModelTokenizer, prompt_ids: list[int], params: SamplingParams,
                 skip_special_tokens: bool, include_stop: bool, timer: RequestTimer):
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        self.stops = StopStringMatcher(params.stop, include_stop)
        self.params, self.include_stop, self.timer = params, include_stop, timer
        self.num_tokens = self.cached = 0
        self.stop_reason: str | int | None = None
        self.logprobs: list[TokenLogprob] = []
        self.prompt: dict[int, PromptLogprobEntry] | None = {} if params.prompt_logprobs is not None else None

    def prompt_record(self, event: TokenEvent) -> None:
        """A prompt token's logprobs: before the first token; a recomputed prefill may send one again."""
        if self.prompt is not None:
            tops = list(zip(event.top_ids, event.top_logprobs, strict=True))
            self.prompt[-event.position] = PromptLogprobEntry(event.token_id, event.logprob, event.rank, tops)

    def token_record(self, event: TokenEvent) -> tuple[str, FinishReason, bool]:
        """(its final text, its finish reason, whether a stop string matched in it)."""
        reason = event.finish_reason
        self.cached = max(self.cached, event.cached_tokens)
        piece = ""
        if event.token_id >= 0:
            self.num_tokens += 1
            self.timer.token(event.queue_us)
            if self.params.logprobs is not None:
                tops = [(t, lp) for t, lp in zip(event.top_ids, event.top_logprobs, strict=True) if t >= 0]
                self.logprobs.append(TokenLogprob(event.token_id, event.logprob, tops))
            if reason == FinishReason.STOP and event.token_id in self.params.stop_token_ids:
                self.stop_reason = event.token_id  # (EOS leaves stop_reason None, as vLLM)
            if reason != FinishReason.STOP or self.include_stop:  # a stop token is not output text by default
                piece = self.detokenizer.add(event.token_id)
        if event.finished:
            piece += self.detokenizer.flush()
        text, stopped = self.stops.feed(piece, check=self.num_tokens >= self.params.min_tokens)
        if stopped:
            reason, self.stop_reason = FinishReason.STOP, self.stops.matched
        elif event.finished:
            text += self.stops.flush()
        return text, reason, stopped

    def delta(self, text: str, reason: FinishReason, done: bool) -> Delta:
        """The output since the last delta; the prompt's logprobs ride on the first."""
        delta = Delta(text, self.logprobs, reason.openai if done else None, self.num_tokens, self.cached,
                      reason == FinishReason.ERROR, self.stop_reason if done else None)
        if self.prompt is not None:
            delta.prompt_logprobs, self.prompt = [self.prompt[i] for i in sorted(self.prompt)], None
        self.logprobs = []
        return delta


async def _deltas(ctx: GenerationContext, req_id: int, queue: asyncio.Queue, timer: RequestTimer,
                  prompt_ids: list[int], params: SamplingParams, skip_special_tokens: bool,
                  include_stop: bool, started: list[bool]) -> AsyncIterator[Delta]:
    started[0] = True
    records = _Records(ctx.tokenizer, prompt_ids, params, skip_special_tokens, include_stop, timer)
    done, sent_at = False, None  # sent_at: the token count at the last delta (None: none sent yet)
    text, reason = "", FinishReason.NONE
    try:
        while not done:
            # All records already queued make one delta: a consumer that fell behind (a starved front end)
            # catches up with one chunk, not one a token, so its work shrinks as its lag grows.
            events: list[TokenEvent] = [await queue.get()]
            while not queue.empty():
                events.append(queue.get_nowait())
            for event in events:
                if event.is_prompt:
                    records.prompt_record(event)
                    continue
                piece, reason, stopped = records.token_record(event)
                text += piece
                if stopped:
                    ctx.client.abort(req_id)
                done = stopped or event.finished
                if reason == FinishReason.ERROR and ctx.client.cut_by_shutdown:
                    raise APIError(503, "server shutting down: the request was cut before it finished")
                if done:
                    break  # the rest of the batch: the records of a request we aborted
            # --stream-interval: the first text goes at once (TTFT), then one delta per that many tokens
            due = sent_at is None or records.num_tokens - sent_at >= ctx.stream_interval
            if done or (text and due):
                delta = records.delta(text, reason, done)
                text, sent_at = "", records.num_tokens
                yield delta
                if done:
                    timer.finish(delta.finish_reason)
    finally:
        if not done:
            ctx.client.abort(req_id)


async def merge(streams: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave several choices' deltas as they come, tagged with the choice index."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    sentinel = object()

    async def pump(index: int, stream: AsyncIterator[Delta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except Exception as e:  # handed to the consumer, which re-raises it
            await queue.put((index, e))
            return
        await queue.put((index, sentinel))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is sentinel:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(stream: AsyncIterator[Delta]) -> Delta:
    """The whole output of one choice as a single delta (non-streaming responses)."""
    texts, logprobs, last, prompt = [], [], Delta(""), None
    async for delta in stream:
        texts.append(delta.text)
        logprobs.extend(delta.logprobs)
        prompt = prompt if delta.prompt_logprobs is None else delta.prompt_logprobs
        last = delta
    return Delta("".join(texts), logprobs, last.finish_reason, last.num_tokens, last.cached_tokens, last.error,
                 last.stop_reason, prompt)
