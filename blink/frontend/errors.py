"""OpenAI's error format for every error, FastAPI's validation errors included, and status codes as vLLM."""
from __future__ import annotations

from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               413: "RequestEntityTooLarge", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    """Raised anywhere in a handler; answered as {"error": {...}} with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status) or _phrase(status),
                      "param": param, "code": status}}


ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error"}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def anthropic_error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('msg')}", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    if first.get("type") == "extra_forbidden":  # fields nobody implements: say so (all of them), never ignore them
        extra = [".".join(str(p) for p in e.get("loc", ()) if p != "body") for e in errors
                 if e.get("type") == "extra_forbidden"]
        rest = len(errors) - len(extra)
        more = f" (and {rest} more errors)" if rest else ""
        return f"{', '.join(extra)}: unsupported field{'s' if len(extra) > 1 else ''} (see docs/api.md){more}", param
    return f"{param or 'body'}: {first.get('msg')}{more}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        if request.url.path in ANTHROPIC_PATHS:
            return JSONResponse(anthropic_error_body(exc.status, exc.message), status_code=exc.status)
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        if request.url.path in ANTHROPIC_PATHS:
            return JSONResponse(anthropic_error_body(400, message), status_code=400)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
