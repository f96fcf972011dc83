"""Tool calling: the grammar of required / named choices, and the parsers (whole and streamed)."""
import json

import jsonschema
import numpy as np
import pytest

from blink.frontend.errors import APIError
from blink.frontend.tools import HERMES, LLAMA3, ToolStream, parse_tool_calls, plan_tools, tool_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["tz"], "additionalProperties": False}}}
LLAMA_TEMPLATE = "{{ '<|python_tag|>' }}{% for m in messages %}{{ m.content }}{% endfor %}"
PARAMS = {"get_weather": WEATHER["function"]["parameters"], "get_time": TIME["function"]["parameters"]}


def random_output(compiler, tok, eos, constraint, seed):
    """A random walk through the constraint's automaton until EOS: what any model would be forced to."""
    tables = compiler.compile(constraint)
    rng, state, ids = np.random.default_rng(seed), 0, []
    while True:
        allowed = np.flatnonzero(tables.allowed(state))
        non_eos = [t for t in allowed if t not in eos]
        if not non_eos or (len(non_eos) < len(allowed) and rng.random() < 0.5):
            return tok.decode(ids)
        t = int(rng.choice(non_eos))
        ids.append(t)
        state = tables.walk([t], state)


@pytest.mark.parametrize("template, fmt", [(None, HERMES), (LLAMA_TEMPLATE, LLAMA3)])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_calls_parse_and_validate(demo_compiler, demo_vocab, template, fmt, choice):
    tok, eos, _ = demo_vocab
    plan = plan_tools([WEATHER, TIME], choice, None, tool_format(template))
    assert plan.fmt == fmt and plan.constraint is not None
    for seed in range(6):
        text = random_output(demo_compiler, tok, eos, plan.constraint, seed)
        content, calls = parse_tool_calls(text, plan)
        assert calls and content is None, text
        for call in calls:
            assert call["type"] == "function" and call["id"].startswith("call_")
            name = call["function"]["name"]
            assert name == "get_time" or choice == "required"
            jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[name])
        streamed = ToolStream(plan)
        pieces = [streamed.feed(text[i:i + 3]) for i in range(0, len(text), 3)]
        rest, again = streamed.finish()
        assert "".join(pieces) + rest == "" and [c["function"] for c in again] == [c["function"] for c in calls]


def test_parallel_false_means_one_call(demo_compiler, demo_vocab):
    tok, eos, _ = demo_vocab
    plan = plan_tools([WEATHER], "required", False, HERMES)
    for seed in range(4):
        assert len(parse_tool_calls(random_output(demo_compiler, tok, eos, plan.constraint, seed), plan)[1]) == 1


def test_auto_parses_hermes_and_keeps_plain_text():
    plan = plan_tools([WEATHER], "auto", None, HERMES)
    assert plan.constraint is None and plan.parse
    text = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, plan)
    assert content == "Let me look." and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    assert parse_tool_calls("just words", plan) == ("just words", [])
    assert parse_tool_calls('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', plan)[1] == []
    stream = ToolStream(plan)
    assert stream.feed("Let me look.<tool") == "Let me look."  # a possible opener is held back
    assert stream.feed("_call>\n{...") == ""


def test_auto_without_parallel_calls_keeps_the_first():
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "unit": "c"}}\n</tool_call>'
    text = "A." + block % "Oslo" + block % "Rome"
    for parallel, cities in ((None, ["Oslo", "Rome"]), (False, ["Oslo"])):
        content, calls = parse_tool_calls(text, plan_tools([WEATHER], "auto", parallel, HERMES))
        assert content == "A." and [json.loads(c["function"]["arguments"])["city"] for c in calls] == cities


def test_anthropic_tool_choice_maps_onto_chat():
    from blink.frontend.messages_protocol import ToolChoice, to_chat_choice

    assert to_chat_choice(None) == (None, None)
    assert to_chat_choice(ToolChoice(type="any")) == ("required", None)
    assert to_chat_choice(ToolChoice(type="auto", disable_parallel_tool_use=True)) == ("auto", False)
    assert to_chat_choice(ToolChoice(type="tool", name="f", disable_parallel_tool_use=False)) == (
        {"type": "function", "function": {"name": "f"}}, True)
    assert to_chat_choice(ToolChoice(type="none")) == ("none", None)
    for bad in (ToolChoice(type="tool"), ToolChoice(type="auto", name="f"),
                ToolChoice(type="none", disable_parallel_tool_use=False)):
        with pytest.raises(ValueError, match="tool_choice"):
            to_chat_choice(bad)


def test_tool_format_follows_the_template():
    assert tool_format("{% if tools %}<tool_call>{% endif %}") == HERMES
    assert tool_format(LLAMA_TEMPLATE) == LLAMA3


@pytest.mark.parametrize("tools, choice, param", [
    ([WEATHER], {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
    (None, "required", "tool_choice"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([{"type": "retrieval"}], "auto", "tools[0]"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "array", "uniqueItems": True}}}}}], "required", "tools[0].function.parameters"),
])
def test_bad_tool_requests(tools, choice, param):
    with pytest.raises(APIError) as e:
        plan_tools(tools, choice, None, HERMES)
    assert e.value.status == 400 and e.value.param == param


def test_llama3_calls_separated_by_semicolons():
    plan = plan_tools([WEATHER, TIME], "auto", None, LLAMA3)
    text = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
            '{"name": "get_time", "parameters": {"zone": "UTC"}}')
    content, calls = parse_tool_calls(text, plan)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert len(parse_tool_calls(text, plan_tools([WEATHER, TIME], "auto", False, LLAMA3))[1]) == 1
    for bad in (text + " and more", text.replace("; ", " "), text.replace("get_time", "nope")):
        assert parse_tool_calls(bad, plan) == (bad, [])
