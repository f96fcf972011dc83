"""The bench client against a canned SSE stream: chunks split across reads, a line longer than aiohttp's
default line limit (512 KiB here), an HTTP error."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from blink.bench.client import stream_completion
from blink.bench.runner import READ_BUFSIZE


def _sse(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


async def _serve_once(status: int, body_parts: list[bytes]):
    """A one-request HTTP/1.1 server on 127.0.0.1 that writes the response in the given pieces."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        body = b"".join(body_parts)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                     % (status, len(body)))
        for part in body_parts:  # separate writes: the client must join lines across reads
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _run(status: int, body_parts: list[bytes]):
    async def main():
        server, port = await _serve_once(status, body_parts)
        async with server, aiohttp.ClientSession(read_bufsize=READ_BUFSIZE) as http:
            return await stream_completion(http, f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"}, 1)
    return asyncio.run(main())


def test_tokens_usage_and_a_line_longer_than_aiohttps_default_limit():
    long_text = "y" * 1_000_000
    stream = (_sse({"choices": [{"text": "a", "finish_reason": None}]})
              + _sse({"choices": [{"text": long_text, "finish_reason": None}]})
              + _sse({"choices": [{"text": "", "finish_reason": "length"}]})
              + _sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}) + _sse("[DONE]"))
    parts = [stream[i:i + 4096] for i in range(0, len(stream), 4096)]
    result = _run(200, parts)
    assert result.success, result.error
    assert result.generated_text == "a" + long_text
    assert result.output_tokens == 3 and result.prompt_len == 7
    assert len(result.itl) == 1  # two token chunks; the text-less closing chunk is no token
    assert 0 < result.ttft <= result.latency


def test_an_http_error_is_a_failed_result():
    result = _run(500, [b'{"error": "boom"}'])
    assert not result.success
    assert result.error.startswith("HTTP 500") and "boom" in result.error
