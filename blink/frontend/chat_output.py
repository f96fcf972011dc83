"""A chat choice's generated text as an assistant message: reasoning (`--reasoning-parser`), content and
tool calls, for a whole output and for a stream of deltas. Both use the same parsers in the same order
(reasoning first, then tool calls in what is left), so a stream's pieces join to the unstreamed message.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from blink.frontend.forced_calls import ForcedCallStream
from blink.frontend.tool_xml import QWEN3_CODER
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


@dataclass
class Piece:
    """What a streamed choice sends now: reasoning, content, and OpenAI's `delta.tool_calls` entries (an entry
    with an `id` starts a call; the others add to the arguments of the call at their `index`)."""

    thought: str = ""
    content: str = ""
    calls: list[dict] = field(default_factory=list)


class ChoiceStream:
    """A streamed choice: feed() each delta's text, finish() with the last one's."""

    def __init__(self, reasoning: ReasoningPlan | None, tools: ToolPlan | None):
        self.plan = reasoning
        self.splitter = ReasoningSplitter(reasoning.fmt, reasoning.starts_thinking) if reasoning else None
        parse = tools is not None and tools.parse
        # a grammar-forced call is sent as it is written; under auto the calls are held to the end
        # (JSON formats only: Qwen3-Coder's XML calls are converted whole, at the end)
        self.forced = ForcedCallStream() if parse and tools.constraint is not None and tools.fmt != QWEN3_CODER \
            else None
        self.tools = ToolStream(tools) if parse and self.forced is None else None
        self.unsent = ""  # stream_reasoning=false: the reasoning so far, sent once the block ends
        self.used_tools = False

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

    def _content(self, text: str, piece: Piece) -> None:
        if self.forced is not None:
            piece.calls += self.forced.feed(text)
        elif self.tools is not None:  # content until a tool call may start
            piece.content += self.tools.feed(text)
        else:
            piece.content += text

    def feed(self, text: str) -> Piece:
        piece = Piece()
        if self.splitter is not None:
            thought, text = self.splitter.feed(text)
            piece.thought = self._reasoning(thought, False)
        self._content(text, piece)
        self.used_tools = self.used_tools or bool(piece.calls)
        return piece

    def finish(self, text: str) -> Piece:
        """The rest, once the output is complete (held calls come whole, one entry each)."""
        piece = self.feed(text)
        if self.splitter is not None:
            more, rest = self.splitter.finish()
            piece.thought += self._reasoning(more, True)
            self._content(rest, piece)
        if self.forced is not None:
            piece.content += self.forced.finish()
        if self.tools is not None:
            rest, calls = self.tools.finish()
            piece.content += rest
            piece.calls += [{"index": k, **call} for k, call in enumerate(calls)]
        self.used_tools = self.used_tools or bool(piece.calls)
        return piece
