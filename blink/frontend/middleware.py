"""Plain ASGI middleware (no BaseHTTPMiddleware: it would hide client disconnects from streams)."""
from __future__ import annotations

import hmac
import logging
import re
import time
import uuid

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from blink.frontend.errors import error_response

OPEN_PATHS = ("/health", "/metrics", "/ping", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect")
REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")  # what we accept in X-Request-Id (it lands in ids and logs)
access_log = logging.getLogger("blink.access")


class ApiKeyMiddleware:
    """With an API key, every other path needs `Authorization: Bearer <key>` or Anthropic's `x-api-key: <key>`
    (else 401)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        bearer = headers.get(b"authorization", b"")
        ok = hmac.compare_digest(bearer, b"Bearer " + self.key) or \
            hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)
        if not ok:
            return await error_response(401, "missing or invalid API key")(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: up front from Content-Length, else while it is being read."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large()(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI re-raises HTTPException from body reading; our handler formats it
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counting_receive, send)

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"

    def _too_large(self):
        return error_response(413, self._message())


class RequestIdMiddleware:
    """X-Request-Id: the client's (if well-formed; else 400) or a fresh one, used as the request's id
    (response ids, the access log) and echoed on the response. Also the request's arrival time, where the
    server's TTFT clock starts (metrics.RequestTimer): its headers are parsed, its body not yet read."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        arrival = time.perf_counter()
        given = dict(scope["headers"]).get(b"x-request-id")
        if given is not None and not REQUEST_ID.fullmatch(given):
            response = error_response(400, "X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]",
                                      "X-Request-Id")
            return await response(scope, receive, send)
        rid = given.decode() if given is not None else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"], state["arrival"] = rid, arrival

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


class AccessLogMiddleware:
    """One line per request when its response ends (streams: at the last chunk), on the blink.access
    logger: client, method, path, status, duration, request id. --disable-log-requests turns it off."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [0]

        async def logging_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self._log(scope, status[0], start)

        try:
            await self.app(scope, receive, logging_send)
        except BaseException:
            self._log(scope, status[0] or 500, start)
            raise

    @staticmethod
    def _log(scope: Scope, status: int, start: float) -> None:
        client = scope.get("client") or ("-", 0)
        state = scope.get("state", {})
        user = f" user={state['user']!r}" if state.get("user") else ""
        access_log.info('%s:%s "%s %s" %d %.1fms id=%s%s', client[0], client[1], scope["method"], scope["path"],
                        status, 1000 * (time.perf_counter() - start), state.get("request_id", "-"), user)
