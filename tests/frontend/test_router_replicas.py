"""Two `blink serve` replicas (demo model, host mode, CPU) behind the real vllm-router from pip: every
request succeeds with the right usage, both replicas serve, a replica drained mid-run loses no
accepted request, and power_of_two routes on the loads blink reports."""
from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from blink.bench.router_process import Router, generated_tokens
from blink.model.demo import ensure_default_model
from blink.text.tokenizer import load_tokenizer
from tests.frontend.router_harness import complete
from tests.frontend.server_process import ServerProcess

pytest.importorskip("vllm_router")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

MAX_TOKENS = 8
LONG_TOKENS = 150  # seconds of decoding on the CPU: still running when the drain starts
BUSY_TOKENS = 1500  # a's load in the power_of_two test: cancelled at the end, never finished


@pytest.fixture(scope="module")
def replicas():  # one pair for the module: the drain test, which stops one, runs last
    procs = [ServerProcess(["--max-num-seqs", "16", "--shutdown-timeout", "60"]) for _ in range(2)]
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(ensure_default_model()))


def router_for(replicas, policy: str) -> Router:
    router = Router([r.base_url for r in replicas], policy)
    router.wait_ready()
    return router


def expect_usage(tok, prompt: str, max_tokens: int) -> dict:
    n = len(tok.encode(prompt))
    return {"prompt_tokens": n, "completion_tokens": max_tokens, "total_tokens": n + max_tokens}


async def burst(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> list[tuple[str, dict]]:
    """Every prompt once, odd ones streamed, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: str):
        async with gate:
            return await complete(client, url, prompt, max_tokens, stream=i % 2 == 1)

    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def test_power_of_two_routes_on_the_reported_loads(replicas):
    a, b = replicas
    router = router_for(replicas, "power_of_two")
    try:
        asyncio.run(load_a_then_route(router, a, b))
    finally:
        router.stop()


async def load_a_then_route(router: Router, a: ServerProcess, b: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        started = [asyncio.Event() for _ in range(6)]
        busy = [asyncio.create_task(complete(client, a.base_url, f"busy {i}", BUSY_TOKENS, True, s))
                for i, s in enumerate(started)]  # straight to a, not through the router
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 60)
        deadline = time.monotonic() + 10
        while True:  # the router's own view, from blink's /get_load: real numbers, not -1
            workers = (await client.get(router.base_url + "/get_loads")).json()["workers"]
            loads = {w["worker"]: w["load"] for w in workers}
            if loads == {a.base_url: 6, b.base_url: 0}:
                break
            assert time.monotonic() < deadline, loads
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # the load monitor (every second) has cached a's load by now
        b_before = generated_tokens(b.base_url)
        for i in range(8):  # one at a time: the router's own in-flight count never outweighs a's load
            finish, _ = await complete(client, router.base_url, f"routed {i}", MAX_TOKENS, stream=i % 2 == 1)
            assert finish == "length"
        assert generated_tokens(b.base_url) - b_before == 8 * MAX_TOKENS  # every one went to the idle b
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)


def test_forty_requests_then_a_drain_mid_run(replicas, tok):
    a, b = replicas
    router = router_for(replicas, "round_robin")
    try:
        before = [generated_tokens(r.base_url) for r in replicas]
        prompts = [f"request {i}: once upon a time" + " there" * (i % 5) for i in range(40)]
        results = asyncio.run(burst(router.base_url, prompts, MAX_TOKENS, concurrency=8))
        for prompt, (finish, usage) in zip(prompts, results, strict=True):
            assert finish == "length" and usage == expect_usage(tok, prompt, MAX_TOKENS)
        served = [generated_tokens(r.base_url) - n for r, n in zip(replicas, before, strict=True)]
        assert sum(served) == 40 * MAX_TOKENS and min(served) > 0, served  # both replicas served
        asyncio.run(drain_mid_run(router, a, b, tok))
        assert a.wait_exit(30) == 0
        assert "drained in" in "".join(a.stderr), a.stderr[-5:]
    finally:
        router.stop()


async def drain_mid_run(router: Router, a: ServerProcess, b: ServerProcess, tok) -> None:
    """Long streams on both replicas; SIGTERM to `a` once every stream has its first token; then new
    requests. All of them finish: a's streams on a, every new request on b."""
    b_before = generated_tokens(b.base_url)
    async with httpx.AsyncClient(timeout=120) as client:
        started = [asyncio.Event() for _ in range(8)]
        long_prompts = [f"long story {i}" for i in range(8)]
        streams = [asyncio.create_task(complete(client, router.base_url, p, LONG_TOKENS, True, s))
                   for p, s in zip(long_prompts, started, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 60)
        on_a = (await client.get(a.base_url + "/get_load")).json()["load"]
        assert 0 < on_a < 8, on_a  # round robin put streams on both replicas
        a.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (await client.get(a.base_url + "/health")).status_code != 503:
            assert time.monotonic() < deadline, "/health stayed 200 after SIGTERM"
            await asyncio.sleep(0.02)
        assert not any(s.done() for s in streams), "the long streams must still be running at the drain"
        new_prompts = [f"after the drain {i}" for i in range(10)]
        new = [complete(client, router.base_url, p, MAX_TOKENS, stream=i % 2 == 1) for i, p in enumerate(new_prompts)]
        for prompt, (finish, usage) in zip(new_prompts, await asyncio.gather(*new), strict=True):
            assert finish == "length" and usage == expect_usage(tok, prompt, MAX_TOKENS)
        for prompt, (finish, usage) in zip(long_prompts, await asyncio.gather(*streams), strict=True):
            assert finish == "length" and usage == expect_usage(tok, prompt, LONG_TOKENS)  # a's streams too
    # b generated its own long streams and every new request; a's streams stayed on a.
    assert generated_tokens(b.base_url) - b_before == (8 - on_a) * LONG_TOKENS + 10 * MAX_TOKENS
