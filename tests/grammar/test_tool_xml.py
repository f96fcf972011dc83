"""Qwen3-Coder's XML-like tool calls: parsing by the schema's types, the forced call's grammar over the demo
vocabulary, and a forced call through the real `blink serve --tool-call-parser qwen3_coder` (random weights)."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from blink.frontend.errors import APIError
from blink.frontend.tool_xml import QWEN3_CODER
from blink.frontend.tools import ToolStream, parse_tool_calls, plan_tools, tool_format
from blink.grammar.tables import CLASS_EOS
from blink.request import Constraint
from tests.frontend.server_process import ServerProcess

WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]},
    "detail": {"type": "object"}}}
CHECK = {"type": "object", "required": ["n", "ok", "unit"], "properties": {
    "n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"},
    "unit": {"type": "string", "enum": ["c", "f"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "check", "parameters": CHECK}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan <Francisco>\nBay\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=detail>\n{\"wind\": true}\n</parameter>\n"
        "</function>\n</tool_call>")


def test_format_from_the_template():
    assert tool_format("{% for p in params %}<function={{ name }}>{% endfor %}") == QWEN3_CODER


def test_parse_by_the_schemas_types():
    plan = plan_tools(TOOLS, "auto", None, QWEN3_CODER)
    content, calls = parse_tool_calls("Let me look.\n" + CALL + "\n" + CALL.replace("San <Francisco>\nBay", "Oslo"),
                                      plan)
    assert content == "Let me look."
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "San <Francisco>\nBay", "days": 3, "detail": {"wind": True}}, {"city": "Oslo", "days": 3,
                                                                                   "detail": {"wind": True}}]
    assert len(parse_tool_calls(CALL + CALL, plan_tools(TOOLS, "auto", False, QWEN3_CODER))[1]) == 1
    for bad in (CALL.replace("get_weather", "unknown"), CALL.replace("</parameter>\n</function>", "</parameter>\nx\n"
                                                                     "</function>")):
        assert parse_tool_calls(bad, plan) == (bad, [])  # malformed: the text is handed back
    stream = ToolStream(plan)
    assert stream.feed("Hi <tool") == "Hi " and stream.feed("_call>\n<function=check>") == ""


def _accepts(tables, tok, text: str) -> bool:
    state = tables.walk(tok.encode(text, add_special_tokens=False).ids)
    return state >= 0 and tables.next_state[state, CLASS_EOS] >= 0


def test_forced_grammar(demo_compiler, demo_vocab):
    tok = demo_vocab[0]
    plan = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, False, QWEN3_CODER)
    assert isinstance(plan.constraint, Constraint)
    tables = demo_compiler.compile(plan.constraint)
    assert _accepts(tables, tok, CALL)
    assert _accepts(tables, tok, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n"
                                 "<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>")
    for bad in (CALL.replace("<parameter=city>\nSan <Francisco>\nBay\n</parameter>\n", ""),  # required
                CALL.replace("\n3\n", "\nthree\n"), CALL.replace("get_weather", "check")):
        assert not _accepts(tables, tok, bad)
    with pytest.raises(APIError, match="pattern is not enforced"):
        plan_tools([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}}}], "required", None,
            QWEN3_CODER)


@pytest.mark.slow
def test_forced_calls_parse_and_validate_with_random_weights():
    proc = ServerProcess(["--served-model-name", "demo", "--engine", "host", "--device", "cpu", "--max-num-seqs", "4",
                          "--grammar-arena-mb", "8", "--tool-call-parser", "qwen3_coder"])
    proc.wait_ready()
    try:
        body = {"model": "demo", "messages": [{"role": "user", "content": "check it"}], "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "check"}}, "max_tokens": 400, "seed": 4}
        message = httpx.post(proc.base_url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
        assert message["finish_reason"] == "tool_calls", message
        (call,) = message["message"]["tool_calls"]
        assert call["function"]["name"] == "check"
        jsonschema.validate(json.loads(call["function"]["arguments"]), CHECK)
    finally:
        proc.stop()
