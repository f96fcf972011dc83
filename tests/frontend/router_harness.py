"""An async client that checks every answer, for blink replicas behind the real vllm-router."""
from __future__ import annotations

import asyncio
import json

import httpx


async def complete(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, stream: bool,
                   started: asyncio.Event | None = None) -> tuple[str, dict]:
    """One completion that must succeed: (finish_reason, usage). `started` is set at the first chunk."""
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    if not stream:
        response = await client.post(url + "/v1/completions", json=body)
        assert response.status_code == 200, response.text
        data = response.json()
        return data["choices"][0]["finish_reason"], data["usage"]
    body.update(stream=True, stream_options={"include_usage": True})
    payloads = []
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payloads.append(line[len("data: "):])
                if started is not None:
                    started.set()
    assert payloads[-1] == "[DONE]", payloads[-3:]
    events = [json.loads(p) for p in payloads[:-1]]
    assert not any("error" in e for e in events), events[-1]
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert len(finishes) == 1, finishes
    return finishes[0], events[-1]["usage"]
