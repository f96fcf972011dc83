"""One large request stalls nobody (issue 18 item 1): tokenization runs on the worker pool, hopeless prompts
are refused from their length, and the pool's cap answers 503."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from blink.frontend.errors import APIError
from blink.frontend.text_workers import INLINE_ENCODE_CHARS, TextWorkers
from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

TWO_MB = ("The quick brown fox jumps over the lazy dog; " * 50_000)[:2_000_000]
LONG = "hello world " * (INLINE_ENCODE_CHARS // 10)  # over the inline bound: tokenized on the pool
HEALTH_BOUND_S = 0.5  # the bound on how much a large request may delay /health


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("stall-model"))


def test_min_tokens_is_a_lower_bound(model_dir):
    tok = load_tokenizer(str(model_dir))
    for text in ("", "a", "hello world", "ünïcödé ✓ " * 30, TWO_MB[:20_000], "x" * 5000):
        assert tok.min_tokens(text) <= len(tok.encode(text, add_special_tokens=False))
    assert tok.min_tokens(TWO_MB) > 10_000  # and it is not vacuous: a 2 MB prompt is refused from it


def test_pool_caps_concurrent_jobs_with_a_503(model_dir):
    tok = load_tokenizer(str(model_dir))
    workers = TextWorkers(tok, workers=1, max_pending=1)
    release = threading.Event()

    async def main():
        first = asyncio.ensure_future(workers.run(release.wait, 10))
        while workers.pending == 0:
            await asyncio.sleep(0.001)
        with pytest.raises(APIError) as info:
            await workers.encode(LONG)
        assert info.value.status == 503
        # a text too short for the hop is tokenized on the loop: the full pool does not refuse it
        assert await workers.encode("hello world") == tok.encode("hello world")
        release.set()
        assert await first is True
        assert await workers.encode(LONG) == tok.encode(LONG)  # room again

    try:
        asyncio.run(main())
    finally:
        release.set()
        workers.close()


def test_a_burst_of_200_at_once_is_queued_not_refused(model_dir):
    """The cap is a runaway guard: `blink bench serve --request-rate inf` sends 200 prompts at once, and at the
    old cap of 64 an H100 host answered 9 of them 503 (2026-12-05)."""
    tok = load_tokenizer(str(model_dir))
    workers = TextWorkers(tok)
    texts = [f"{i} " + LONG for i in range(200)]

    async def main():
        return await asyncio.gather(*(workers.encode(t) for t in texts))

    try:
        assert asyncio.run(main()) == [tok.encode(t) for t in texts]
    finally:
        workers.close()


@pytest.mark.slow
def test_large_prompt_delays_neither_health_nor_streams(model_dir):
    server = ServerProcess(["--model", str(model_dir), "--engine-module", "tests.frontend.fake_engine"],
                           env={"FAKE_ENGINE_STEP_S": "0.02"})  # 240 tokens take about 5 s
    server.wait_ready()
    url = server.base_url
    gaps: list[float] = []
    health: list[float] = []
    stop = threading.Event()

    def stream() -> None:
        body = {"prompt": "one two three four", "max_tokens": 240, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            last = None
            for _ in response.iter_lines():
                now = time.perf_counter()
                if last is not None and not stop.is_set():
                    gaps.append(now - last)
                last = now

    def probe() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                start = time.perf_counter()
                assert c.get(url + "/health").status_code == 200
                health.append(time.perf_counter() - start)
                time.sleep(0.02)

    try:
        streamer = threading.Thread(target=stream)
        streamer.start()
        time.sleep(0.3)
        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=60) as c:
            start = time.perf_counter()
            refused = c.post("/v1/completions", json={"prompt": TWO_MB, "max_tokens": 4})
            refused_s = time.perf_counter() - start
            chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": TWO_MB}]})
            start = time.perf_counter()
            tokenized = c.post("/tokenize", json={"prompt": TWO_MB})  # really tokenizes all 2 MB
            tokenize_s = time.perf_counter() - start
        stop.set()
        prober.join()
        streamer.join()
    finally:
        stop.set()
        server.stop()
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
    assert chat.status_code == 400 and "maximum context length" in chat.json()["error"]["message"]
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 100_000
    assert refused_s < 2.0, refused_s  # refused from its length, not after tokenizing it
    assert len(health) >= 10 and len(gaps) >= 10, (len(health), len(gaps), tokenize_s)
    print(f"2 MB: refused in {refused_s:.3f} s, tokenized in {tokenize_s:.2f} s; worst /health "
          f"{max(health):.3f} s over {len(health)} probes; worst stream gap {max(gaps):.3f} s")
    assert max(health) <= HEALTH_BOUND_S, max(health)
    assert max(gaps) <= HEALTH_BOUND_S, max(gaps)


def test_text_workers_run_below_the_loops_priority():
    """Pool workers are reniced relative to the thread that started them (the front end's niceness, which
    `blink serve --frontend-nice` sets), so tokenization always yields to the event loop."""
    import os

    from blink.frontend.text_workers import WORKER_NICE, TextWorkers
    from blink.text.tokenizer import ModelTokenizer, synthetic_tokenizer

    tok = synthetic_tokenizer(100)
    workers = TextWorkers(ModelTokenizer(tok, 100, None))
    try:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        theirs = asyncio.run(workers.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        assert theirs == min(19, mine + WORKER_NICE)
    finally:
        workers.close()
