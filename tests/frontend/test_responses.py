"""POST /v1/responses through `blink serve --reasoning-parser qwen3` with the fake engine and an echo
template (a message is exactly what the "model" answers), checked with the openai client."""
# ruff: noqa: F811 - the echo model's fixtures come from test_reasoning_http
from __future__ import annotations

import json

import httpx
import pytest

from tests.frontend.test_reasoning_http import ANSWER, model_dir, serve_echo, tokens  # noqa: F401 (fixtures)

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def server(model_dir):
    proc = serve_echo(model_dir, "qwen3")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def test_text_and_reasoning(client, tokens):
    plain = client.responses.create(model="fake", input="Hello there", max_output_tokens=tokens("Hello there"))
    assert plain.output_text == "Hello there" and [o.type for o in plain.output] == ["message"]
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"  # the echo's end
    assert plain.id.startswith("resp_") and plain.model == "fake" and plain.store is False
    thought = client.responses.create(model="fake", input=ANSWER, max_output_tokens=tokens(ANSWER),
                                      instructions="", metadata={"k": "v"})
    assert [o.type for o in thought.output] == ["reasoning", "message"]
    assert thought.output[0].content[0].text == "\nThe user greets me.\n"
    assert thought.output_text == "Hello there, friend." and thought.metadata == {"k": "v"}
    assert thought.usage.output_tokens == tokens(ANSWER) and thought.usage.output_tokens_details.reasoning_tokens > 0
    assert thought.usage.input_tokens == tokens(ANSWER)


def test_function_calls_and_items_passed_back(client, tokens):
    out = client.responses.create(model="fake", input=CALL, tools=TOOLS, max_output_tokens=tokens(CALL))
    (call,) = out.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    # a conversation with the call and its output: the echo template writes the texts, "" for the call
    items = [{"role": "user", "content": "Hi"}, {"type": "function_call", "call_id": call.call_id,
                                                 "name": "get_weather", "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    again = client.responses.create(model="fake", input=items, tools=TOOLS, max_output_tokens=tokens("HiSunny"))
    assert again.output_text == "HiSunny"
    # a client passes a whole answer back (its reasoning and message items) and goes on
    answer = client.responses.create(model="fake", input=ANSWER, max_output_tokens=tokens(ANSWER))
    history = [{"role": "user", "content": "Q"}, *[o.model_dump(exclude_none=True) for o in answer.output],
               {"role": "user", "content": "More"}]
    text = "QHello there, friend.More"
    assert client.responses.create(model="fake", input=history, max_output_tokens=tokens(text)).output_text == text


def _events(client, **kwargs) -> list:
    return list(client.responses.create(model="fake", stream=True, **kwargs))


def test_streams_join_to_the_response(client, tokens):
    events = _events(client, input=ANSWER, max_output_tokens=tokens(ANSWER))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "\nThe user greets me.\n"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello there, friend."
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == "Hello there, friend."
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done == ["reasoning", "message"]
    # a forced call streams its arguments as they are written
    forced = _events(client, input=CALL, tools=TOOLS, tool_choice="required", max_output_tokens=tokens(CALL))
    pieces = [e.delta for e in forced if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Paris"}
    (item,) = forced[-1].response.output
    assert item.type == "function_call" and json.loads(item.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("body, param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": [{"role": "system", "content": "only a system message"}]}, "input"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
])
def test_refusals_name_the_field(server, body, param):
    r = httpx.post(server.base_url + "/v1/responses", json={"model": "fake", "input": "hi", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
