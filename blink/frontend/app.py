"""The FastAPI application: routes, error handlers, API key and body-size middleware."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from blink.frontend.chat import chat_prompt_ids, create_chat_completion
from blink.frontend.completions import create_completion
from blink.frontend.engine_client import EngineClient
from blink.frontend.errors import APIError, error_response, install_error_handlers
from blink.frontend.metrics import FrontendMetrics
from blink.frontend.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from blink.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from blink.frontend.serving import FrontendState, now
from blink.frontend.worker_routes import install_worker_routes
from blink.text.tokenizer import load_tokenizer

DEFAULT_MAX_BODY_BYTES = 32 << 20


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
    tensor_parallel_size: int = 1


def build_app(config: AppConfig) -> FastAPI:
    tokenizer = load_tokenizer(config.model, config.tokenizer)  # here, so a bad model fails before serving
    holder: dict[str, FrontendState] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        client = EngineClient(config.shm_name, config.heartbeat_timeout_s)
        client.start()
        holder["state"] = FrontendState(tokenizer, client, FrontendMetrics(config.engine_pid),
                                        config.served_model_name)
        try:
            yield
        finally:
            client.close()

    app = FastAPI(title="blink", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)  # outermost: runs first

    def state() -> FrontendState:
        return holder["state"]

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(state(), body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(state(), body, request)

    @app.get("/v1/models")
    async def models():
        s = state()
        return {"object": "list", "data": [{"id": s.served_model_name, "object": "model", "created": now(),
                                            "owned_by": "blink", "root": config.model,
                                            "max_model_len": s.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        s = state()
        s.check_model(body.model)
        if body.messages is not None:
            tokens = chat_prompt_ids(s, body.messages, body.add_generation_prompt, body.chat_template_kwargs)
        elif body.prompt is not None:
            tokens = s.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            raise APIError(400, "either prompt or messages is required", "prompt")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": s.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        s = state()
        s.check_model(body.model)
        s.check_token_ids(body.tokens, "tokens")
        return {"prompt": s.tokenizer.decode(body.tokens)}

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

    @app.get("/ping")
    async def ping():
        return JSONResponse({})

    return app
