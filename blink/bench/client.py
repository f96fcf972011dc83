"""One streaming OpenAI completion request, timed chunk by chunk.

On aiohttp, not httpx: on the 2-core CPU machine httpx's streaming client added about 1.5 ms to every
measured TTFT over aiohttp's (docs/perf.md, 2026-12-01), which the server then seemed to cost.
"""
from __future__ import annotations

import json
import time

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from blink.bench.metrics import RequestResult
from blink.bench.workload import SampleRequest


def completion_payload(model: str, request: SampleRequest, ignore_eos: bool, temperature: float) -> dict:
    payload = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.expected_output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


def is_token_chunk(choice: dict) -> bool:
    """A chunk that carries generated output. A closing chunk with no text (only a finish reason) does
    not: counting it would add a spurious inter-token gap."""
    return bool(choice.get("text")) or choice.get("finish_reason") is None


async def stream_completion(http: aiohttp.ClientSession, url: str, payload: dict,
                            prompt_len: int, result: RequestResult | None = None) -> RequestResult:
    """Send one request; TTFT at the first token chunk, one ITL per later token chunk, E2E at the last. Fills
    `result` as the stream goes (the caller keeps what a cancelled request received)."""
    result = result or RequestResult(prompt_len=prompt_len)
    start = time.perf_counter()
    result.start_time = start
    last_token_time = start
    token_chunks = 0
    completion_tokens = None
    try:
        async with http.post(url, json=payload) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                result.error = f"HTTP {response.status}: {body[:300]}"
                return result
            async for line in response.content:  # one SSE line per iteration, b"\n" included
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:"):].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"])[:300]
                    return result
                now = time.perf_counter()
                choices = chunk.get("choices") or []
                if choices and is_token_chunk(choices[0]):
                    if token_chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last_token_time)
                    last_token_time = now
                    token_chunks += 1
                    result.streamed_tokens = token_chunks
                    result.generated_text += choices[0].get("text") or ""
                usage = chunk.get("usage")
                if usage:
                    completion_tokens = usage.get("completion_tokens")
                    result.prompt_len = usage.get("prompt_tokens") or result.prompt_len
                    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except (aiohttp.ClientError, HttpProcessingError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if token_chunks == 0:
        result.error = "the stream ended without any token"
        return result
    result.latency = last_token_time - start
    result.output_tokens = completion_tokens if completion_tokens is not None else token_chunks
    result.success = True
    return result
