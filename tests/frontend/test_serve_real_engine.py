"""End-to-end: the real `blink serve` (host engine, tiny random Llama on CPU) through the openai client."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import openai
import pytest

from tests.frontend.server_process import ServerProcess
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("serve"), "llama")


@pytest.fixture(scope="module")
def server(model_dir):
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "host",
                          "--device", "cpu", "--max-num-seqs", "16"])
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def running_requests(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    return float(re.search(r"^blink:num_requests_running{[^}]*} (\S+)$", text, re.M).group(1))


def test_greedy_stream_equals_non_stream(client):
    kwargs = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
              "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 24
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_stream_equals_non_stream(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    kwargs = {"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0}
    full = client.chat.completions.create(**kwargs)
    usage_option = {"include_usage": True}
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options=usage_option))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens >= 1
    assert full.choices[0].finish_reason in ("stop", "length")


def test_concurrent_streams_match_non_streamed(server):
    """32 streams with different parameters at once; each, seeded, equals its non-streamed rerun."""

    def params(i: int) -> dict:
        return {"model": "tiny", "prompt": f"{PROMPT} {i}", "max_tokens": 3 + i % 6, "seed": 1000 + i,
                "temperature": [0.0, 0.7, 1.3][i % 3], "top_p": [1.0, 0.9][i % 2], "logprobs": i % 3 or None,
                "presence_penalty": 0.5 * (i % 2), "extra_body": {"ignore_eos": True, "top_k": [0, 5][i % 2]}}

    async def one(c, i):
        texts, finishes, usage = [], [], None
        async for chunk in await c.completions.create(**params(i), stream=True,
                                                      stream_options={"include_usage": True}):
            if chunk.choices:
                texts.append(chunk.choices[0].text)
                finishes.append(chunk.choices[0].finish_reason)
            else:
                usage = chunk.usage
        return "".join(texts), finishes, usage

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0) as c:
            streamed = await asyncio.gather(*(one(c, i) for i in range(32)))
            again = await asyncio.gather(*(c.completions.create(**params(i)) for i in range(32)))
        return streamed, again

    streamed, again = asyncio.run(main())
    for i, ((text, finishes, usage), full) in enumerate(zip(streamed, again, strict=True)):
        assert finishes[-1] == "length" and all(f is None for f in finishes[:-1]), i
        assert usage.completion_tokens == 3 + i % 6 and usage.prompt_tokens == full.usage.prompt_tokens, i
        assert text == full.choices[0].text, i


def generated_tokens(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    return float(re.search(r"^blink:engine_generated_tokens_total{[^}]*} (\S+)$", text, re.M).group(1))


@pytest.fixture(scope="module")
def disconnect_max_tokens():
    return 200  # fits the tiny model's 256-token context; the CPU takes far longer than the test


def test_disconnect_frees_the_request(server, client, disconnect_max_tokens):
    max_tokens = disconnect_max_tokens  # only an abort can end the request before this many tokens
    before = generated_tokens(server.base_url)
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=max_tokens, stream=True,
                                       extra_body={"ignore_eos": True})
    first = [next(iter(stream)) for _ in range(2)]
    assert all(c.choices[0].finish_reason is None for c in first)
    stream.close()
    deadline = time.monotonic() + 15
    while running_requests(server.base_url) != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.05)
    assert generated_tokens(server.base_url) - before < max_tokens, "the request ran to the end: not aborted"


def test_stop_string_aborts_engine_request(server, client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.usage.completion_tokens < 12


def test_banner_metrics_and_messages(server, client):
    """What the engine itself published: the banner, the control-block metrics, and /v1/messages (over plain
    HTTP: tests/frontend/test_anthropic.py drives it with the anthropic client, which the GPU image lacks)."""
    mode = "device" if "--engine" in server.args and "device" in server.args else "host"
    text = "".join(server.stderr)
    assert f"engine mode {mode}" in text and "dtype float32" in text
    blocks = re.search(r"KV cache (\d+) blocks x (\d+) tokens = (\d+) tokens", text)
    assert blocks and int(blocks.group(1)) * int(blocks.group(2)) == int(blocks.group(3)) > 0
    graphs = re.search(r"forward graphs: (\d+) buckets of up to (\d+) tokens, captured", text)
    assert (graphs is not None) == (mode == "device")  # host mode on the CPU runs eagerly
    assert mode == "device" or "forward graphs: none (eager; " in text
    reply = httpx.post(server.base_url + "/v1/messages", headers={"x-api-key": "x", "anthropic-version": "2023-06-01"},
                       json={"model": "tiny", "max_tokens": 5, "temperature": 0,
                             "messages": [{"role": "user", "content": "Hello"}]}, timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["type"] == "message" and body["content"][0]["type"] == "text" and body["usage"]["output_tokens"] <= 5
    metrics = httpx.get(server.base_url + "/metrics").text
    steps = re.search(r'^blink:engine_steps_total{model_name="tiny"} (\S+)$', metrics, re.M)
    assert steps and float(steps.group(1)) > 0
    iterations = re.search(r'^blink:iteration_tokens_total_count{model_name="tiny"} (\S+)$', metrics, re.M)
    assert iterations and float(iterations.group(1)) == float(steps.group(1))  # every step in one bucket
    queued = re.search(r'^blink:request_queue_time_seconds_sum{model_name="tiny"} (\S+)$', metrics, re.M)
    assert queued and float(queued.group(1)) > 0  # the engine measured its requests' queue time
    assert re.search(r'^blink:request_generation_tokens_count{model_name="tiny"} [1-9]', metrics, re.M)
    assert re.search(r'^blink:num_preemptions_total{model_name="tiny"} \d', metrics, re.M)


def test_sigterm_to_process_group_cleans_up(model_dir):
    check_sigterm_cleans_up(["--model", str(model_dir), "--engine", "host", "--device", "cpu"])


def check_sigterm_cleans_up(serve_args: list[str]) -> None:
    proc = ServerProcess(serve_args, new_session=True)
    proc.wait_ready()
    children = proc.children()
    assert len(children) == 2 and proc.segments()
    os.killpg(proc.process.pid, signal.SIGTERM)
    assert proc.wait_exit(20) == 0
    assert proc.children() == [] and proc.segments() == []
