"""The real vllm-router (pip) in front of blink replicas, and an async client that checks every answer."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.frontend.server_process import free_port

ROUTER = Path(sys.executable).with_name("vllm-router")  # the console script the wheel installs


class Router:
    def __init__(self, worker_urls: list[str], policy: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        # Short intervals: the load monitor (power_of_two) and the health checker poll every second.
        command = [str(ROUTER), "--worker-urls", *worker_urls, "--policy", policy, "--port", str(self.port),
                   "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1",
                   "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                   "--log-level", "warning"]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _ok(self.base_url + "/health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"the router did not start:\n{self.log.read().decode()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.log.close()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def generated_tokens(base_url: str) -> int:
    """Tokens the replica's engine generated so far (from its control block, via /get_server_info)."""
    return httpx.get(base_url + "/get_server_info", timeout=5).json()["generated_tokens"]


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
