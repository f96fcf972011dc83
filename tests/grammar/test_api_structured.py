"""Structured outputs through the real `blink serve` (host engine, demo model: random weights, CPU)."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from tests.frontend.server_process import ServerProcess
from tests.grammar.test_host_structured import SCHEMAS, strict_json


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(["--served-model-name", "demo", "--engine", "host", "--device", "cpu",
                          "--max-num-seqs", "8", "--grammar-arena-mb", "8"])
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url + "/v1", timeout=120) as c:
        yield c


def post(http, path, **body):
    return http.post(path, json={"model": "demo", **body})


def test_chat_json_schema_outputs_validate(http):
    for i, schema in enumerate(SCHEMAS):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        r = post(http, "/chat/completions", messages=[{"role": "user", "content": "give me json"}],
                 response_format=fmt, max_tokens=150, n=2, seed=i)
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(strict_json(choice["message"]["content"]), schema)


def test_vllm_fields_and_streaming(http):
    choices = ["sunny", "rainy day", "snow"]
    r = post(http, "/completions", prompt="Weather:", max_tokens=20, structured_outputs={"choice": choices})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in choices
    r = post(http, "/completions", prompt="Code:", max_tokens=20, guided_regex=r"[A-Z]{3}-[0-9]{3}", temperature=0)
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{3}", r.json()["choices"][0]["text"])
    r = post(http, "/completions", prompt="x", max_tokens=120, guided_json=SCHEMAS[0], seed=3)
    jsonschema.validate(strict_json(r.json()["choices"][0]["text"]), SCHEMAS[0])
    r = post(http, "/completions", prompt="x", max_tokens=20, guided_choice=choices)
    assert r.json()["choices"][0]["text"] in choices
    with http.stream("POST", "/completions", json={"model": "demo", "prompt": "x", "max_tokens": 150, "seed": 5,
                                                    "stream": True, "structured_outputs": {"json": SCHEMAS[2]}}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(strict_json(text), SCHEMAS[2])


def test_json_object(http):
    r = post(http, "/chat/completions", messages=[{"role": "user", "content": "json"}], max_tokens=300, seed=1,
             response_format={"type": "json_object"})
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(strict_json(choice["message"]["content"]), dict)


@pytest.mark.parametrize("body, status, param", [
    ({"response_format": {"type": "yaml"}}, 400, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}, 400,
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, 400, "response_format.json_schema.schema"),
    ({"guided_regex": "a(b"}, 400, "guided_regex"),
    ({"guided_choice": []}, 400, "guided_choice"),
    ({"guided_grammar": "root ::= 'a'"}, 400, "guided_grammar"),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, 400, "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, 400, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, 400, "guided_choice"),
    ({"guided_regex": "[a-z]{5000}"}, 400, "guided_regex"),
    ({"guided_regex": "a+", "ignore_eos": True}, 400, "guided_regex"),
])
def test_bad_constraints_get_a_400_naming_the_field(http, body, status, param):
    r = post(http, "/completions", prompt="x", max_tokens=5, **body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_server_keeps_serving_after_refusals(http):
    r = post(http, "/completions", prompt="x", max_tokens=3)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_tool_choice_required_and_named(http):
    from tests.grammar.test_tools import PARAMS, TIME, WEATHER

    messages = [{"role": "user", "content": "weather in Oslo?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = post(http, "/chat/completions", messages=messages, tools=[WEATHER, TIME], tool_choice=choice,
                 max_tokens=200, n=2, seed=4)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert c["finish_reason"] == "tool_calls", c
            for call in c["message"]["tool_calls"]:
                name = call["function"]["name"]
                assert call["type"] == "function" and (choice == "required" or name == "get_weather")
                jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[name])


def test_tool_calls_stream_in_openai_shape(http):
    from tests.grammar.test_tools import PARAMS, WEATHER

    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 200, "stream": True, "seed": 2}
    with http.stream("POST", "/chat/completions", json=body) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    entries = [tc for d in deltas for tc in d.get("tool_calls", [])]
    # a forced call streams as it is written: id and name first, then its arguments' text in pieces
    assert {e["index"] for e in entries} == {0} and entries[0]["id"].startswith("call_")
    assert entries[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all("id" not in e for e in entries[1:]) and len(entries) > 2
    assert not any(d.get("content") for d in deltas)
    arguments = "".join(e["function"]["arguments"] for e in entries)
    jsonschema.validate(strict_json(arguments), PARAMS["get_weather"])
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_anthropic_tool_choice_any_and_tool(http):
    """/v1/messages forces a call with the chat path's grammar: the tool_use blocks' inputs validate."""
    from tests.grammar.test_tools import PARAMS

    tools = [{"name": name, "input_schema": schema} for name, schema in PARAMS.items()]
    messages = [{"role": "user", "content": "weather in Oslo?"}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_time"}):
        r = post(http, "/messages", messages=messages, tools=tools, tool_choice=choice, max_tokens=200)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["stop_reason"] == "tool_use" and out["content"], out
        for block in out["content"]:
            assert block["type"] == "tool_use" and block["id"].startswith("toolu_"), out
            assert choice["type"] == "any" or block["name"] == "get_time"
            jsonschema.validate(block["input"], PARAMS[block["name"]])
    body = {"model": "demo", "messages": messages, "tools": tools, "max_tokens": 200, "stream": True,
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}}
    with http.stream("POST", "/messages", json=body) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    inputs = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert [b["type"] for b in starts] == ["tool_use"] and starts[0]["name"] == "get_weather", events
    assert len(inputs) > 1  # the input's JSON as it is written
    jsonschema.validate(strict_json("".join(inputs)), PARAMS["get_weather"])
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"


def test_tool_choice_auto_and_conflicts(http):
    from tests.grammar.test_tools import WEATHER

    messages = [{"role": "user", "content": "hi"}]
    r = post(http, "/chat/completions", messages=messages, tools=[WEATHER], max_tokens=8)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    r = post(http, "/chat/completions", messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=8,
             response_format={"type": "json_object"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_responses_text_format_and_forced_call(http):
    """/v1/responses' text.format is chat's response_format: the output validates even with random weights."""
    from tests.grammar.test_tools import PARAMS

    fmt = {"type": "json_schema", "name": "s", "schema": SCHEMAS[1], "strict": True}
    r = post(http, "/responses", input="give me json", text={"format": fmt}, max_output_tokens=150)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "completed" and out["text"]["format"]["schema"] == SCHEMAS[1]
    jsonschema.validate(strict_json(out["output"][0]["content"][0]["text"]), SCHEMAS[1])
    tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS["get_weather"]}]
    r = post(http, "/responses", input="weather?", tools=tools, tool_choice="required", max_output_tokens=200)
    calls = [o for o in r.json()["output"] if o["type"] == "function_call"]
    assert calls and all(c["name"] == "get_weather" for c in calls), r.text
    for call in calls:
        jsonschema.validate(strict_json(call["arguments"]), PARAMS["get_weather"])
