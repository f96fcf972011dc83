"""--reasoning-parser through `blink serve` with the fake engine, whose output echoes the prompt: with a chat
template that writes only the messages' text, a message is exactly what the "model" answers."""
from __future__ import annotations

import json

import httpx
import pytest

from blink.text.tokenizer import load_tokenizer
from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

ECHO_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = make_tokenizer_only_model(tmp_path_factory.mktemp("echo-model"))
    (path / "chat_template.jinja").write_text(ECHO_TEMPLATE)
    return path


def serve_echo(model_dir, parser: str) -> ServerProcess:
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "fake", "--reasoning-parser", parser,
                          "--engine-module", "tests.frontend.fake_engine"], env={"FAKE_ENGINE_STEP_S": "0.002"})
    proc.wait_ready()
    return proc


@pytest.fixture(scope="module")
def http(model_dir):
    proc = serve_echo(model_dir, "qwen3")
    with httpx.Client(base_url=proc.base_url + "/v1", timeout=30) as c:
        yield c
    proc.stop()


@pytest.fixture(scope="module")
def tokens(model_dir):
    tok = load_tokenizer(str(model_dir))
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def chat(http, tokens, text: str, **body) -> httpx.Response:
    """The answer is `text` itself: the echo stops after as many tokens as its prompt has."""
    return http.post("/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                "max_tokens": tokens(text), **body})


def stream(http, tokens, text: str, **body) -> list[dict]:
    payload = {"messages": [{"role": "user", "content": text}], "max_tokens": tokens(text), "stream": True, **body}
    with http.stream("POST", "/chat/completions", json=payload) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines()
                if line.startswith("data: {")]


def joined(deltas: list[dict], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


ANSWER = "<think>\nThe user greets me.\n</think>\n\nHello there, friend."


def test_reasoning_is_split_out(http, tokens):
    message = chat(http, tokens, ANSWER).json()["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "\nThe user greets me.\n"
    assert message["content"] == "Hello there, friend."
    plain = chat(http, tokens, "Hello <think> stays text").json()["choices"][0]["message"]
    assert plain["content"] == "Hello <think> stays text" and plain["reasoning"] is None


def test_streamed_reasoning_joins_to_the_message(http, tokens):
    deltas = stream(http, tokens, ANSWER)
    assert joined(deltas, "reasoning") == joined(deltas, "reasoning_content") == "\nThe user greets me.\n"
    assert joined(deltas, "content") == "Hello there, friend."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning") for d in deltas[first_content:])  # the block comes first
    held = stream(http, tokens, ANSWER, stream_reasoning=False)  # SGLang's: in one piece
    pieces = [d["reasoning"] for d in held if d.get("reasoning")]
    assert pieces == ["\nThe user greets me.\n"] and joined(held, "content") == "Hello there, friend."


def test_switches(http, tokens):
    hidden = chat(http, tokens, ANSWER, include_reasoning=False).json()["choices"][0]["message"]
    assert hidden["reasoning"] is None and hidden["content"] == "Hello there, friend."
    assert not joined(stream(http, tokens, ANSWER, include_reasoning=False), "reasoning")
    raw = chat(http, tokens, ANSWER, separate_reasoning=False).json()["choices"][0]["message"]
    assert raw["content"] == ANSWER and "reasoning" not in raw


def test_tool_calls_are_parsed_after_the_block(http, tokens):
    text = '<think>I need the weather.</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
           '\n</tool_call>'
    message = chat(http, tokens, text, tools=TOOLS).json()["choices"][0]["message"]
    assert message["reasoning"] == "I need the weather." and message["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"city": "Paris"}]
    deltas = stream(http, tokens, text, tools=TOOLS)
    assert joined(deltas, "reasoning") == "I need the weather." and not joined(deltas, "content")
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    # forced (the fake engine ignores the grammar, which lets the thought come first): streamed as written
    forced = stream(http, tokens, text, tools=TOOLS, tool_choice="required")
    entries = [c for d in forced for c in d.get("tool_calls") or []]
    assert joined(forced, "reasoning") == "I need the weather." and len(entries) > 1
    assert entries[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert json.loads("".join(e["function"]["arguments"] for e in entries)) == {"city": "Paris"}


def test_deepseek_r1_starts_in_the_block(model_dir, tokens):
    proc = serve_echo(model_dir, "deepseek-r1")  # SGLang's spelling of vLLM's deepseek_r1
    try:
        with httpx.Client(base_url=proc.base_url + "/v1", timeout=30) as c:
            message = chat(c, tokens, "First, add.</think>\n\n4").json()["choices"][0]["message"]
            assert (message["reasoning"], message["content"]) == ("First, add.", "4")
            cut = chat(c, tokens, "still thinking").json()["choices"][0]["message"]  # never closed
            assert (cut["reasoning"], cut["content"]) == ("still thinking", None)
    finally:
        proc.stop()


def test_unknown_parser_is_one_line():
    proc = ServerProcess(["--reasoning-parser", "granite", "--engine-module", "tests.frontend.fake_engine"])
    assert proc.wait_exit(60) == 2
    assert "unknown reasoning parser 'granite'" in "".join(proc.stderr)


def test_anthropic_messages_get_a_thinking_block(http, tokens):
    body = {"model": "fake", "max_tokens": tokens(ANSWER), "messages": [{"role": "user", "content": ANSWER}]}
    out = http.post("/messages", json=body).json()
    assert out["content"] == [{"type": "thinking", "thinking": "\nThe user greets me.\n", "signature": ""},
                              {"type": "text", "text": "Hello there, friend."}]
    with http.stream("POST", "/messages", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    starts = [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text")]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "\nThe user greets me.\n"
    assert "".join(d.get("text", "") for d in deltas) == "Hello there, friend."
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    # a client passes the answer back whole: its thinking block is dropped from the next prompt
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": out["content"]},
               {"role": "user", "content": "And?"}]
    without = [history[0], {"role": "assistant", "content": out["content"][1:]}, history[2]]
    count = [http.post("/messages/count_tokens", json={"model": "fake", "messages": m}).json()["input_tokens"]
             for m in (history, without)]
    assert count[0] == count[1] > 0
    bad = http.post("/messages/count_tokens", json={"model": "fake", "messages": [
        {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]})
    assert bad.status_code == 400 and "thinking blocks belong to assistant messages" in bad.text
