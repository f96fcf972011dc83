"""What completions and chat share: the server state, request checks, usage, SSE framing."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from fastapi import Request

from blink.frontend.engine_client import EngineClient, EngineUnavailable
from blink.frontend.errors import APIError, error_body
from blink.frontend.generation import GenerationContext
from blink.frontend.metrics import FrontendMetrics
from blink.frontend.protocol import SamplingFields
from blink.request import SamplingParams
from blink.text.tokenizer import ModelTokenizer


@dataclass
class FrontendState:
    tokenizer: ModelTokenizer
    client: EngineClient
    metrics: FrontendMetrics
    served_model_name: str

    @property
    def max_model_len(self) -> int:
        """The engine's, from the control block (503 until the engine has started)."""
        try:
            return self.client.limits().max_model_len
        except EngineUnavailable as e:
            raise APIError(503, str(e)) from None

    @property
    def generation(self) -> GenerationContext:
        return GenerationContext(self.client, self.tokenizer, self.metrics)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")

    def check_engine(self) -> None:
        if self.client.draining:  # before any response starts, so a router can retry elsewhere
            raise APIError(503, "server shutting down")
        if not self.client.engine_alive():
            raise APIError(503, "the engine is not running")

    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt")
        self.check_token_ids(prompt_ids, "prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                f"However, your prompt has {len(prompt_ids)} tokens.", "prompt")

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of vocabulary (valid: 0..{vocab - 1})", param)

    def max_tokens_for(self, prompt_ids: list[int], requested: int | None) -> int:
        """The request's max_tokens: the rest of the context when not given, 400 when out of range."""
        room = self.max_model_len - len(prompt_ids)
        if requested is None:
            return room
        if requested < 1:
            raise APIError(400, "max_tokens must be at least 1", "max_tokens")
        if requested > room:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                f"However, you requested {len(prompt_ids) + requested} tokens "
                                f"({len(prompt_ids)} in the prompt, {requested} in the completion).",
                           "max_tokens")
        return requested

    def sampling_params(self, body: SamplingFields, prompt_ids: list[int], max_tokens: int | None,
                        logprobs: int | None, choice_index: int) -> SamplingParams:
        max_tokens = self.max_tokens_for(prompt_ids, max_tokens)
        try:
            params = body.sampling_params(max_tokens, logprobs, choice_index)
        except ValueError as e:
            raise APIError(400, str(e)) from None
        self.check_token_ids([*params.logit_bias, *params.stop_token_ids], "logit_bias")
        return params


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def sse_stream(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Frame chunks as server-sent events, ending with [DONE]; an error mid-stream becomes an error event."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except APIError as e:
        yield sse(error_body(e.status, e.message, e.param))
    except Exception as e:  # headers are sent: the error can only travel as an event
        yield sse(error_body(500, f"internal error: {type(e).__name__}: {e}"))
    yield sse("[DONE]")


async def unless_disconnected(request: Request, work: Awaitable):
    """Run `work` but cancel it (aborting its engine requests) if the client goes away first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise APIError(499, "client disconnected")
    return task.result()
