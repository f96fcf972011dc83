"""End-to-end prefix caching through `blink serve` (host engine, tiny Llama on CPU): cached_tokens in
usage, the Prometheus counters, POST /reset_prefix_cache, and --no-enable-prefix-caching."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.frontend.server_process import ServerProcess
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

BLOCK = 16  # the servers below are started with it, whatever --block-size's default is


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("prefix"), "llama")


def serve(model_dir, *extra):
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "host",
                          "--device", "cpu", "--block-size", str(BLOCK), *extra])
    proc.wait_ready()
    return proc


def complete(base_url: str, prompt: list[int], stream: bool = False) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    if not stream:
        return httpx.post(base_url + "/v1/completions", json=body, timeout=60).json()["usage"]
    body.update(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return json.loads(lines[-1][len("data: "):])["usage"]


def counter(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    return float(re.search(rf"^{re.escape(name)}{{model_name=\"[^\"]*\"}} (\S+)$", text, re.M).group(1))


def test_cached_tokens_counters_and_reset(model_dir):
    proc = serve(model_dir)
    try:
        url = proc.base_url
        prompt = list(range(5, 5 + 2 * BLOCK + 5))  # two full blocks and a bit
        first = complete(url, prompt)
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        again = complete(url, prompt, stream=True)
        assert again["prompt_tokens_details"] == {"cached_tokens": 2 * BLOCK}
        assert counter(url, "blink:prefix_cache_queries_total") == 2 * len(prompt)
        assert counter(url, "blink:prefix_cache_hits_total") == 2 * BLOCK
        assert httpx.post(url + "/reset_prefix_cache", timeout=30).status_code == 200
        assert complete(url, prompt)["prompt_tokens_details"] == {"cached_tokens": 0}
    finally:
        proc.stop()


def test_the_cache_can_be_turned_off(model_dir):
    proc = serve(model_dir, "--no-enable-prefix-caching")
    try:
        prompt = list(range(5, 5 + 2 * BLOCK + 5))
        for _ in range(2):
            assert complete(proc.base_url, prompt)["prompt_tokens_details"] == {"cached_tokens": 0}
        assert counter(proc.base_url, "blink:prefix_cache_queries_total") == 0
    finally:
        proc.stop()
