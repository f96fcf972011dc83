"""What completions and chat share: the server state, request checks, usage, SSE framing."""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import orjson
from fastapi import Request

from blink.frontend.engine_client import EngineClient, EngineUnavailable
from blink.frontend.errors import APIError, error_body
from blink.frontend.generation import GenerationContext
from blink.frontend.metrics import FrontendMetrics
from blink.frontend.prompt_logprobs import check_prompt_logprobs
from blink.frontend.protocol import SamplingFields
from blink.frontend.structured import StructuredOutputs
from blink.frontend.text_workers import TextWorkers
from blink.frontend.tools import tool_format
from blink.request import SamplingParams
from blink.text.reasoning import ReasoningFormat
from blink.text.tokenizer import ModelTokenizer


@dataclass
class FrontendState:
    tokenizer: ModelTokenizer
    client: EngineClient
    metrics: FrontendMetrics
    served_model_name: str
    text: TextWorkers
    model_root: str = ""
    structured: StructuredOutputs | None = None  # response_format, structured_outputs, guided_*
    stream_interval: int = 1  # --stream-interval (generation.py)
    reasoning: ReasoningFormat | None = None  # --reasoning-parser (chat_output.py)
    tool_parser: str | None = None  # --tool-call-parser's format (tools.py); None: the chat template's
    trust_request_chat_template: bool = False  # --trust-request-chat-template: requests may bring their own
    sampling_defaults: dict = field(default_factory=dict)  # --generation-config (sampling_defaults.py)
    chat_template_kwargs: dict = field(default_factory=dict)  # --default-chat-template-kwargs

    def tool_format(self, request_template: str | None = None) -> str:
        """The tool-call format: --tool-call-parser's, else the one the chat template shows (the request's
        own template where it brings one)."""
        if self.tool_parser:
            return self.tool_parser
        if request_template is not None:
            return tool_format(request_template)
        template = self.tokenizer.chat_template
        return tool_format(template and template.source)

    @property
    def max_model_len(self) -> int:
        """The engine's, from the control block (503 until the engine has started)."""
        try:
            return self.client.limits().max_model_len
        except EngineUnavailable as e:
            raise APIError(503, str(e)) from None

    def generation_for(self, body: SamplingFields) -> GenerationContext:
        """The context for this request: its own `stream_interval` (vLLM's field) over the server's."""
        return GenerationContext(self.client, self.tokenizer, self.metrics,
                                 body.stream_interval or self.stream_interval)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")

    def check_engine(self) -> None:
        if self.client.draining:  # before any response starts, so a router can retry elsewhere
            raise APIError(503, "server shutting down")
        if not self.client.engine_alive():
            raise APIError(503, "the engine is not running")

    def check_fields(self, body: SamplingFields) -> None:
        """Field combinations the API refuses (each 400 names its field)."""
        if body.prompt_logprobs is not None:
            if body.stream:  # as vLLM: they come whole, with the response
                raise APIError(400, "prompt_logprobs are not available when stream is true", "prompt_logprobs")
            check_prompt_logprobs(self, body.prompt_logprobs, "prompt_logprobs")
        if body.return_hidden_states:
            raise APIError(400, "return_hidden_states is not supported", "return_hidden_states")
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
        if body.stream_options is not None and body.stream_options.continuous_usage_stats \
                and not body.stream_options.include_usage:
            raise APIError(400, "continuous_usage_stats needs include_usage", "stream_options.continuous_usage_stats")
        self.metrics.params_n.observe(body.n)

    async def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize on the worker pool; a text that cannot fit is refused from its length first."""
        self.precheck_text(text)
        ids = await self.text.encode(text, add_special_tokens)
        self.check_prompt(ids)
        return ids

    def precheck_text(self, text: str) -> None:
        at_least = self.tokenizer.min_tokens(text)
        if at_least >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                f"However, your prompt has at least {at_least} tokens "
                                f"({len(text)} characters).", "prompt")

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
        if requested is None:  # the model's max_new_tokens where it gives one (vLLM's rule), else the room
            return min(room, self.sampling_defaults.get("max_tokens", room))
        if requested < 1:
            raise APIError(400, "max_tokens must be at least 1", "max_tokens")
        if requested > room:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                f"However, you requested {len(prompt_ids) + requested} tokens "
                                f"({len(prompt_ids)} in the prompt, {requested} in the completion).",
                           "max_tokens")
        return requested

    def sampling_params(self, body: SamplingFields, prompt_ids: list[int], max_tokens: int | None,
                        logprobs: int | None, choice_index: int, prompt_logprobs: int | None = None) -> SamplingParams:
        """prompt_logprobs: the prompt's top logprobs wanted (echo + logprobs); None: the body's field."""
        max_tokens = self.max_tokens_for(prompt_ids, max_tokens)
        try:
            params = body.sampling_params(max_tokens, logprobs, choice_index, prompt_logprobs, self.sampling_defaults)
        except ValueError as e:  # the message names the field: "top_p must be in (0, 1]"
            words = re.findall(r"[a-z_]+", str(e))
            raise APIError(400, str(e), next((w for w in words if w in type(body).model_fields), None)) from None
        self.check_token_ids(list(params.logit_bias), "logit_bias")
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        return params

    def token_text(self, token_id: int, as_ids: bool) -> str:
        """A logprobs entry's token: its text, or vLLM's "token_id:N" (return_tokens_as_token_ids)."""
        return f"token_id:{token_id}" if as_ids else self.tokenizer.token_text(token_id)


def request_id(request: Request) -> str:
    """The id RequestIdMiddleware chose: the client's X-Request-Id, or a fresh one."""
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


def arrival(request: Request) -> float | None:
    """When RequestIdMiddleware saw the request (time.perf_counter()); None without that middleware."""
    return request.scope.get("state", {}).get("arrival")


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """cached_tokens: prompt tokens the engine's prefix cache served (vLLM's prompt_tokens_details)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def sse(payload: dict | str, event: str | None = None) -> bytes:
    """One server-sent event, as bytes (the response writes them as they are); `event` names it (Anthropic's).
    orjson: 0.6 us a streamed chunk against json.dumps' 3.2 on the CPU machine (perf.md, session 31); UTF-8 as
    ensure_ascii=False, integer keys as strings as json.dumps makes them (vLLM's prompt_logprobs), no NaN (JSON has
    none: it becomes null)."""
    data = payload.encode() if isinstance(payload, str) else orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
    return (b"event: " + event.encode() + b"\n" if event else b"") + b"data: " + data + b"\n\n"


async def sse_stream(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
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
