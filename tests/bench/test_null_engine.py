"""The zero-cost engine for measuring the front end alone (`blink serve --engine-module
blink.bench.null_engine`): every request gets exactly max_tokens tokens through the real front end and
rings, and the server's own TTFT histogram counts each request."""
from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

pytestmark = pytest.mark.slow  # spawns processes


def test_null_engine_serves_max_tokens_through_the_real_front_end(tmp_path):
    model = make_tokenizer_only_model(tmp_path / "model")
    server = ServerProcess(["--model", str(model), "--engine-module", "blink.bench.null_engine"])
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            for n in (1, 7):
                body = client.post("/v1/completions", json={"model": str(model), "prompt": "hello",
                                                            "max_tokens": n}).json()
                assert body["usage"]["completion_tokens"] == n
                assert body["choices"][0]["finish_reason"] == "length"
            metrics = client.get("/metrics").text
        assert re.search(r"^blink:time_to_first_token_seconds_count{[^}]*} 2.0$", metrics, re.M)
    finally:
        server.stop()
    assert server.wait_exit(20) == 0


def test_null_engine_paced_takes_a_step_a_token(tmp_path):
    """BLINK_NULL_STEP_MS: one token a request a step, so 6 tokens take at least 5 steps after the first."""
    model = make_tokenizer_only_model(tmp_path / "model")
    server = ServerProcess(["--model", str(model), "--engine-module", "blink.bench.null_engine"],
                           env={"BLINK_NULL_STEP_MS": "40"})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            started = time.perf_counter()
            body = client.post("/v1/completions", json={"model": str(model), "prompt": "hello",
                                                        "max_tokens": 6}).json()
            elapsed = time.perf_counter() - started
        assert body["usage"]["completion_tokens"] == 6
        assert elapsed >= 5 * 0.040  # unpaced it answers in about a millisecond
    finally:
        server.stop()
    assert server.wait_exit(20) == 0
