"""Streaming grammar-forced tool calls: whatever the cuts, each call's pieces join to its arguments' text."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from blink.frontend.forced_calls import ForcedCallStream

HERMES = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "days": [1, {"x": null}]}}'
          '\n</tool_call>\n<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>')
LLAMA3 = '{"name": "get_time", "parameters": { "zone" : "UTC" }}'


def _stream(text: str, cuts: list[int]) -> list[dict]:
    stream = ForcedCallStream()
    entries = []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        entries += stream.feed(text[a:b])
    return entries


def _calls(entries: list[dict]) -> list[tuple[str, str, str]]:
    calls: list[list[str]] = []
    for e in entries:
        if "id" in e:
            assert e["index"] == len(calls) and e["type"] == "function" and e["function"]["arguments"] == ""
            calls.append([e["id"], e["function"]["name"], ""])
        else:
            assert e["index"] == len(calls) - 1 and set(e) == {"index", "function"}
            calls[-1][2] += e["function"]["arguments"]
    return [tuple(c) for c in calls]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([HERMES, LLAMA3]), st.data())
def test_cut_anywhere(text, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    calls = _calls(_stream(text, cuts))
    if text is HERMES:
        assert [(n, json.loads(a)) for _, n, a in calls] == [
            ("get_weather", {"city": 'Pa"ris}', "days": [1, {"x": None}]}), ("get_time", {})]
    else:
        assert [(n, a) for _, n, a in calls] == [("get_time", '{ "zone" : "UTC" }')]
    assert all(i.startswith("call_") for i, _, _ in calls) and len({i for i, _, _ in calls}) == len(calls)


def test_pieces_go_out_as_they_come():
    stream = ForcedCallStream()
    assert stream.feed('<tool_call>\n{"name": "get_wea') == []  # the name is not complete
    head = stream.feed('ther", "arguments": {"ci')
    assert head[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert head[1] == {"index": 0, "function": {"arguments": '{"ci'}}
    assert stream.feed('ty": "Oslo"}}\n</tool_call>') == [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]
    assert stream.calls[0]["arguments"] == '{"city": "Oslo"}'


def test_finish_gives_back_text_only_before_any_call():
    cut = ForcedCallStream()
    assert cut.feed('<tool_call>\n{"na') == [] and cut.finish() == '<tool_call>\n{"na'  # as the unstreamed answer
    after = ForcedCallStream()
    after.feed('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"na')
    assert after.finish() == ""
