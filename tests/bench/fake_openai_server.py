"""A tiny OpenAI-compatible streaming server for the bench tests, run in a thread on 127.0.0.1.

Its tokenizer is exact and trivial: one token per character, the id being the code point (the
vocabulary is the first VOCAB_SIZE code points). It adds a BOS (id 1) to every prompt, as real servers
do, and streams one token per chunk, then a usage chunk. max_tokens == FAIL_MAX_TOKENS gets an HTTP 500;
without ignore_eos a request stops after EOS_AFTER tokens.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

VOCAB_SIZE = 500
FAIL_MAX_TOKENS = 13
EOS_AFTER = 3
MODEL = "fake-model"


def encode(text: str) -> list[int]:
    return [ord(c) % VOCAB_SIZE for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


@dataclass
class FakeState:
    token_delay_s: float = 0.002
    payloads: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def build_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics():
        # The "engine" is this very process: the server runs in a thread of the test.
        pid = os.getpid()
        return PlainTextResponse(f'# TYPE blink:engine_pid gauge\nblink:engine_pid{{model_name="fake"}} {pid}.0\n')

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        tokens = ([] if body.get("add_special_tokens") is False else [1]) + encode(body["prompt"])
        return {"tokens": tokens, "count": len(tokens)}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return {"prompt": decode((await request.json())["tokens"])}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        state.payloads.append(body)
        if body["max_tokens"] == FAIL_MAX_TOKENS:
            return JSONResponse({"error": {"message": "refused"}}, status_code=500)
        n = body["max_tokens"] if body.get("ignore_eos") else min(body["max_tokens"], EOS_AFTER)
        prompt_tokens = 1 + len(encode(body["prompt"]))

        async def stream():
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                for i in range(n):
                    await asyncio.sleep(state.token_delay_s)
                    choice = {"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                         "total_tokens": prompt_tokens + n}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


class FakeServer:
    """Context manager: the fake server on a free port; `.base_url`, `.state`."""

    def __init__(self, token_delay_s: float = 0.002):
        self.state = FakeState(token_delay_s=token_delay_s)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.state), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the fake server did not start")
            self._thread.join(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()
