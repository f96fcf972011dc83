"""A constraint after the reasoning block, through the real `blink serve --reasoning-parser qwen3` (host
engine, demo model: random weights, CPU). The grammar lets the answer open with a `<think>` block (Qwen3
hybrid) and applies the schema after it, or the schema alone where the prompt closed the block."""
from __future__ import annotations

import httpx
import jsonschema
import pytest

from tests.frontend.server_process import ServerProcess
from tests.grammar.test_host_structured import SCHEMAS, strict_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(["--served-model-name", "demo", "--engine", "host", "--device", "cpu",
                          "--max-num-seqs", "4", "--grammar-arena-mb", "8", "--reasoning-parser", "qwen3"])
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[0]}}


def test_a_prompt_that_skips_the_thought_gets_the_schema_alone(http):
    """Qwen3's template closes an empty block for enable_thinking=false; here the conversation's last
    (assistant) message does it, left open by continue_final_message."""
    r = http.post("/v1/chat/completions", json={
        "model": "demo", "max_tokens": 150, "seed": 2, "response_format": SCHEMA_FORMAT,
        "messages": [{"role": "user", "content": "json please"}, {"role": "assistant", "content": "<think>\n</think>"}],
        "add_generation_prompt": False, "continue_final_message": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["reasoning"] is None
    jsonschema.validate(strict_json(choice["message"]["content"]), SCHEMAS[0])


def test_the_model_thinks_before_the_schema_applies(http):
    """The prompt leaves the thought to the model: the automaton forces the opening tag and then leaves the
    text free (a schema alone would allow only JSON). A random model never closes it, so no content."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "think, then json"}], "max_tokens": 24,
            "seed": 3, "response_format": SCHEMA_FORMAT}
    raw = http.post("/v1/chat/completions", json={**body, "separate_reasoning": False}).json()["choices"][0]
    assert raw["message"]["content"].startswith("<think>") and raw["finish_reason"] == "length"
    assert "</think>" not in raw["message"]["content"]
    split = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert split["content"] is None and split["reasoning"] == raw["message"]["content"].removeprefix("<think>")
