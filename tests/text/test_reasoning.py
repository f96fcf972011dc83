"""The reasoning parsers: whole outputs, and streams cut anywhere joining to the same split."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.request import Constraint
from blink.text.reasoning import BY_MODEL, OPEN, SKIPPED, ReasoningSplitter, reasoning_format, split_reasoning

R1, QWEN3 = reasoning_format("deepseek_r1"), reasoning_format("qwen3")


@pytest.mark.parametrize("fmt, starts, text, reasoning, content", [
    (R1, True, "plan it</think>\n\nThe answer.", "plan it", "The answer."),
    (R1, True, "<think>\nplan</think>answer", "\nplan", "answer"),  # R1-0528 writes the tag itself
    (R1, True, "still thinking", "still thinking", None),  # never closed: no content
    (R1, True, "done</think>\n\n", "done", None),
    (R1, True, "a</thin</think>b</think>", "a</thin", "b</think>"),  # a later tag is content
    (QWEN3, False, "<think>\nhmm\n</think>\n\nHi!", "\nhmm\n", "Hi!"),
    (QWEN3, False, "  <think>x</think>y", "x", "y"),
    (QWEN3, False, "Hi! <think>not a block</think>", None, "Hi! <think>not a block</think>"),
    (QWEN3, False, "\n\nHello", None, "\n\nHello"),  # content stays as written
    (QWEN3, False, "<thi", None, "<thi"),
    (QWEN3, False, "", None, ""),
    (QWEN3, True, "hmm</think>Hi", "hmm", "Hi"),  # the prompt opened the block
    (QWEN3, True, "<think>", "", None),
])
def test_split(fmt, starts, text, reasoning, content):
    assert split_reasoning(fmt, text, starts) == (reasoning, content)


def test_formats_and_prompts():
    assert reasoning_format("deepseek-r1") is R1  # SGLang's spelling
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        reasoning_format("granite")
    assert R1.thought_at("no tags at all") == R1.thought_at("a closed <think></think>") == OPEN
    assert QWEN3.thought_at("<|im_start|>assistant\n") == BY_MODEL
    assert QWEN3.thought_at("<|im_start|>assistant\n<think>\n") == OPEN
    # enable_thinking=false: Qwen3's template writes an empty, closed block
    assert QWEN3.thought_at("<|im_start|>assistant\n<think>\n\n</think>\n\n") == SKIPPED
    assert QWEN3.thought_at("<think>old</think> then <think>") == OPEN
    assert QWEN3.thought_at("user: what does <think> mean?\nassistant: ") == BY_MODEL
    word = Constraint("regex", "[a-z]+")
    assert QWEN3.constrain(word, SKIPPED) == word
    assert json.loads(QWEN3.constrain(word, BY_MODEL).spec)["starts_open"] is False
    assert json.loads(R1.constrain(word, OPEN).spec)["starts_open"] is True


def _streamed(fmt, starts: bool, pieces: list[str]) -> tuple[str, str, ReasoningSplitter]:
    splitter = ReasoningSplitter(fmt, starts)
    reasoning, content = "", ""
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return reasoning + r, content + c, splitter


_ATOMS = ["<think>", "</think>", "<", "</", "</th", "think>", "a", " ", "\n", "b c"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_ATOMS), max_size=12), st.data(), st.booleans(), st.sampled_from([R1, QWEN3]))
def test_stream_cut_anywhere_joins_to_the_whole_split(atoms, data, starts, fmt):
    text = "".join(atoms)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    reasoning, content, splitter = _streamed(fmt, starts, pieces)
    whole_reasoning, whole_content = split_reasoning(fmt, text, starts)
    assert reasoning == (whole_reasoning or "") and content == (whole_content or "")
    assert splitter.reasoned == (whole_reasoning is not None)
    # nothing is lost but the tags and the whitespace after a closed block
    if whole_reasoning is None:
        assert content == text


def test_stream_holds_only_what_may_be_a_tag():
    splitter = ReasoningSplitter(R1, True)
    assert splitter.feed("abc</th") == ("abc", "")  # "</th" may be the closing tag
    assert splitter.feed("ing") == ("</thing", "")
    assert splitter.feed("</think>") == ("", "")
    assert splitter.feed("  ") == ("", "")  # whitespace after the block: dropped until the answer starts
    assert splitter.feed(" ok ") == ("", "ok ")
    assert splitter.closed and splitter.finish() == ("", "")
    qwen = ReasoningSplitter(QWEN3, False)
    assert qwen.feed("<") == ("", "")  # may be <think>
    assert qwen.feed("tool_call>") == ("", "<tool_call>")
