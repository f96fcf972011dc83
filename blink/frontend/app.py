"""The FastAPI application: routes, error handlers, middleware (access log, request id, body size, API key)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from blink.frontend.banner import wait_and_log_banner
from blink.frontend.chat import chat_prompt, create_chat_completion
from blink.frontend.completions import create_completion
from blink.frontend.engine_client import EngineClient
from blink.frontend.errors import APIError, error_response, install_error_handlers
from blink.frontend.messages import MessagesPrompt, MessagesRequest, count_message_tokens, create_message
from blink.frontend.metrics import FrontendMetrics
from blink.frontend.middleware import AccessLogMiddleware, ApiKeyMiddleware, BodyLimitMiddleware, RequestIdMiddleware
from blink.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from blink.frontend.responses import ResponsesRequest, create_response
from blink.frontend.sampling_defaults import sampling_defaults, template_kwargs
from blink.frontend.serving import FrontendState, now
from blink.frontend.structured import StructuredOutputs
from blink.frontend.text_workers import DEFAULT_MAX_PENDING, DEFAULT_WORKERS, TextWorkers
from blink.frontend.tools import TOOL_PARSERS
from blink.frontend.worker_routes import install_worker_routes
from blink.text.reasoning import reasoning_format
from blink.text.tokenizer import load_tokenizer
from blink.transport.commands import request_prefix_cache_reset
from blink.util.gc_pauses import GcPauses, freeze_heap, unfreeze_heap
from blink.util.loop_lag import LoopLagMonitor

DEFAULT_MAX_BODY_BYTES = 32 << 20
log = logging.getLogger("blink.frontend")
RESET_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AppConfig:
    shm_name: str
    model: str  # model dir or preset (for the tokenizer)
    served_model_name: str
    tokenizer: str | None = None
    api_key: str | None = None
    engine_pid: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    heartbeat_timeout_s: float = 10.0
    log_requests: bool = True  # the access log (--disable-log-requests turns it off)
    tokenizer_workers: int = DEFAULT_WORKERS
    max_pending_tokenizations: int = DEFAULT_MAX_PENDING
    tensor_parallel_size: int = 1
    grammar_arena_mb: int = 64  # the engine's --grammar-arena-mb (the front end mirrors its partitions)
    gc_freeze: bool = True  # freeze the startup heap out of the collector once serving (util/gc_pauses.py)
    stream_interval: int = 1  # a stream's deltas after its first: one per this many tokens (generation.py)
    reasoning_parser: str | None = None  # chat splits a thinking model's output (blink/text/reasoning.py)
    chat_template: str | None = None  # --chat-template: a file or the template, over the model's
    tool_call_parser: str | None = None  # --tool-call-parser (tools.TOOL_PARSERS); None: the template's format
    trust_request_chat_template: bool = False  # a request's own chat_template is refused without it
    generation_config: str = "auto"  # sampling defaults: the model's generation_config.json, `vllm` or a dir
    override_generation_config: str | None = None  # a JSON object over them
    default_chat_template_kwargs: str | None = None  # a JSON object under each request's chat_template_kwargs


def blink_version() -> str:
    try:
        return version("blink")
    except PackageNotFoundError:
        return "unknown"


def build_app(config: AppConfig) -> FastAPI:
    tokenizer = load_tokenizer(config.model, config.tokenizer, config.chat_template)  # a bad model fails here
    reasoning = reasoning_format(config.reasoning_parser) if config.reasoning_parser else None
    defaults = sampling_defaults(config.model, config.generation_config, config.override_generation_config)
    if defaults:
        log.info("sampling defaults from the generation config (a request's own values win): %s", defaults)
    holder: dict[str, FrontendState] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        metrics = FrontendMetrics(config.engine_pid, config.served_model_name)
        client = EngineClient(config.shm_name, config.heartbeat_timeout_s, on_egress_gap=metrics.egress_gap.observe)
        client.start()
        text = TextWorkers(tokenizer, config.tokenizer_workers, config.max_pending_tokenizations)
        structured = StructuredOutputs(tokenizer, config.model, config.grammar_arena_mb << 20, config.tokenizer)
        metrics.watch(text, structured)
        holder["state"] = FrontendState(
            tokenizer, client, metrics, config.served_model_name, text, config.model, structured,
            stream_interval=config.stream_interval, reasoning=reasoning,
            tool_parser=TOOL_PARSERS.get(config.tool_call_parser),
            trust_request_chat_template=config.trust_request_chat_template, sampling_defaults=defaults,
            chat_template_kwargs=template_kwargs(config.default_chat_template_kwargs))
        banner = asyncio.create_task(wait_and_log_banner(client.control, config.model, config.served_model_name))
        if config.gc_freeze:  # last: everything above lives until shutdown
            metrics.gc_frozen.set(freeze_heap())
        gc_pauses = GcPauses(metrics.gc_collected)  # serving's collections (not the freeze's own)
        loop_lag = LoopLagMonitor(metrics.loop_lag.observe, busy=lambda: bool(client.queues))  # a blocked loop
        # stalls every stream; ticks every 20 ms while requests are in flight, every 250 ms idle
        loop_lag.start()
        try:
            yield
        finally:
            await loop_lag.stop()
            gc_pauses.close()
            if config.gc_freeze:
                unfreeze_heap()
            banner.cancel()
            text.close()
            client.close()
            structured.close()

    app = FastAPI(title="blink", version=blink_version(), lifespan=lifespan,
                  description="OpenAI- and Anthropic-compatible API of blink (see docs/api.md)")
    install_error_handlers(app)
    app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(RequestIdMiddleware)  # outside the others: their errors carry the id too
    if config.log_requests:
        app.add_middleware(AccessLogMiddleware)  # outermost: every response is logged

    def state() -> FrontendState:
        return holder["state"]

    def model_card(s: FrontendState) -> dict:
        return {"id": s.served_model_name, "object": "model", "created": now(), "owned_by": "blink",
                "root": s.model_root, "max_model_len": s.max_model_len}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        note_user(request, body.user)
        return await create_completion(state(), body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        note_user(request, body.user)
        return await create_chat_completion(state(), body, request)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        note_user(request, body.user)
        return await create_response(state(), body, request)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        note_user(request, body.metadata.user_id if body.metadata else None)
        return await create_message(state(), body, request)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(body: MessagesPrompt):
        return await count_message_tokens(state(), body)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(state())]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        s = state()
        s.check_model(model_id)
        return model_card(s)

    @app.get("/version")
    async def version_route():
        return {"version": blink_version()}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        s = state()
        s.check_model(body.model)
        if body.messages is not None:
            prompt = await chat_prompt(s, body.messages, body.add_generation_prompt, body.chat_template_kwargs,
                                       continue_final_message=body.continue_final_message,
                                       chat_template=body.chat_template)
            tokens = prompt.ids
        elif body.prompt is not None:
            tokens = await s.text.encode(body.prompt, body.add_special_tokens)
        else:
            raise APIError(400, "either prompt or messages is required", "prompt")
        body = {"tokens": tokens, "count": len(tokens), "max_model_len": s.max_model_len}
        # serialized on the pool: FastAPI's encoder would walk a long token list on the loop
        return Response(await s.text.run(json.dumps, body), media_type="application/json")

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        s = state()
        s.check_model(body.model)
        s.check_token_ids(body.tokens, "tokens")
        return {"prompt": await s.text.decode(body.tokens)}

    install_worker_routes(app, state, config)

    @app.get("/health")
    async def health():
        if state().client.draining:  # routers route away at once; accepted requests still finish
            return error_response(503, "server shutting down")
        if state().client.engine_alive():
            return Response(status_code=200)
        return error_response(503, "the engine loop is not running")

    @app.get("/metrics")
    async def metrics():
        s = state()
        return Response(s.metrics.render(s.client.control), media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """As vLLM: forget every cached KV block; the engine applies it between steps (200 once done)."""
        s = state()
        s.check_engine()
        done = await asyncio.to_thread(request_prefix_cache_reset, s.client.control, RESET_TIMEOUT_S)
        if not done:
            return error_response(503, "the engine did not apply the prefix-cache reset in time")
        return Response(status_code=200)

    @app.get("/ping")
    async def ping():
        return JSONResponse({})

    return app


def note_user(request: Request, user: str | None) -> None:
    """OpenAI's `user` (Anthropic's metadata.user_id) goes into the access log line."""
    if user:
        request.scope.setdefault("state", {})["user"] = user
