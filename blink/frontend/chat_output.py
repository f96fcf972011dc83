"""A chat choice's generated text as an assistant message: reasoning (`--reasoning-parser`), content and
tool calls, for a whole output and for a stream of deltas. Both use the same parsers in the same order
(reasoning first, then tool calls in what is left), so a stream's pieces join to the unstreamed message.
"""
from __future__ import annotations

from dataclasses import dataclass

from blink.frontend.tools import ToolPlan, ToolStream, parse_tool_calls
from blink.text.reasoning import ReasoningFormat, ReasoningSplitter, split_reasoning


@dataclass(frozen=True)
class ReasoningPlan:
    """One request's reasoning: the server's format, where its output begins, and its switches."""

    fmt: ReasoningFormat
    starts_thinking: bool  # the output begins in the block (ReasoningFormat.thought_at is OPEN)
    include: bool = True  # vLLM's include_reasoning: false drops the reasoning from the response
    stream: bool = True  # SGLang's stream_reasoning: false sends it in one piece once the block ends


def reasoning_fields(text: str | None) -> dict:
    """vLLM's `reasoning` and, kept in step with it, `reasoning_content` (SGLang, DeepSeek, older vLLM)."""
    return {"reasoning": text, "reasoning_content": text}


def assistant_message(text: str, finish: str, reasoning: ReasoningPlan | None,
                      tools: ToolPlan | None) -> tuple[dict, str]:
    """(message, finish_reason) of a finished choice; a parsed tool call turns `stop` into `tool_calls`."""
    message = {"role": "assistant", "content": text}
    content = text
    if reasoning is not None:
        thought, content = split_reasoning(reasoning.fmt, text, reasoning.starts_thinking)
        message = {"role": "assistant", "content": content, **reasoning_fields(thought if reasoning.include else None)}
    if tools is not None and tools.parse and content:
        rest, calls = parse_tool_calls(content, tools)
        if calls:
            message = {**message, "content": rest, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
    return message, finish


class ChoiceStream:
    """A streamed choice: feed() each delta's text, finish() with the last one's."""

    def __init__(self, reasoning: ReasoningPlan | None, tools: ToolPlan | None):
        self.plan = reasoning
        self.splitter = ReasoningSplitter(reasoning.fmt, reasoning.starts_thinking) if reasoning else None
        self.tools = ToolStream(tools) if tools is not None and tools.parse else None
        self.unsent = ""  # stream_reasoning=false: the reasoning so far, sent once the block ends

    def _reasoning(self, piece: str, done: bool) -> str:
        if not self.plan.include:
            return ""
        if self.plan.stream:
            return piece
        self.unsent += piece
        if not (done or self.splitter.closed):
            return ""
        out, self.unsent = self.unsent, ""
        return out

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) to send now."""
        thought = ""
        if self.splitter is not None:
            thought, text = self.splitter.feed(text)
            thought = self._reasoning(thought, False)
        if self.tools is not None:  # content until a tool call may start
            text = self.tools.feed(text)
        return thought, text

    def finish(self, text: str) -> tuple[str, str, list[dict]]:
        """(reasoning, content, tool calls) still to send once the output is complete."""
        thought, content = self.feed(text)
        if self.splitter is not None:
            more, rest = self.splitter.finish()
            thought += self._reasoning(more, True)
            if self.tools is not None:
                rest = self.tools.feed(rest)
            content += rest
        calls = []
        if self.tools is not None:
            rest, calls = self.tools.finish()
            content += rest
        return thought, content, calls
