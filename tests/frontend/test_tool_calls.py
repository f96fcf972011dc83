"""Tool-call parsing for /v1/messages, and include_stop_str_in_output in the stop-string matcher."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from blink.frontend.tool_calls import ToolCall, ToolCallSplitter, split_tool_calls
from blink.text.detokenizer import StopStringMatcher

TEXT = ('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> and '
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>not json</tool_call> <tool')


def shape(pieces) -> list:
    return [(p.name, p.arguments) if isinstance(p, ToolCall) else p for p in pieces]


def test_split_tool_calls():
    assert shape(split_tool_calls(TEXT)) == [
        "Sure. ", ("get_weather", {"city": "Paris"}), " and ", ("f", {"x": 1}),
        "<tool_call>not json</tool_call> <tool"]
    assert split_tool_calls("plain text") == ["plain text"]
    assert shape(split_tool_calls('<tool_call>{"name": "g", "parameters": {}}</tool_call>')) == [("g", {})]
    assert split_tool_calls("<tool_call>{} unclosed") == ["<tool_call>{} unclosed"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(TEXT)), max_size=12))
def test_streamed_split_equals_whole(cuts):
    """However the text arrives in deltas, the streamed pieces merge to the whole-text split."""
    bounds = sorted(set([0, *cuts, len(TEXT)]))
    splitter = ToolCallSplitter()
    pieces = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        pieces += splitter.feed(TEXT[a:b])
    pieces += splitter.flush()
    merged: list = []
    for p in pieces:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        elif not isinstance(p, str) or p:
            merged.append(p)
    assert shape(merged) == shape(split_tool_calls(TEXT))


def test_include_stop_string():
    for include, expected in ((False, "one two"), (True, "one two three")):
        matcher = StopStringMatcher([" three", "fo"], include_stop=include)
        out, stopped = "", False
        for delta in ["one", " two", " th", "ree four"]:
            text, stopped = matcher.feed(delta)
            out += text
            if stopped:
                break
        assert (out, stopped, matcher.matched) == (expected, True, " three")
