"""Tool calls in generated text, for the Anthropic Messages API's tool_use blocks.

Recognized format: Hermes / Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (what their
chat templates ask models for). Anything else, malformed JSON inside the tags included, stays text.
`ToolCallSplitter` does the same on a stream: text passes through, held back only while it may be the
start of a tag; a complete tag becomes one tool call.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = ""

    def __post_init__(self):
        self.id = self.id or f"toolu_{uuid.uuid4().hex[:24]}"


def parse_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ToolCall(value["name"], arguments) if isinstance(arguments, dict) else None


def split_tool_calls(text: str) -> list[str | ToolCall]:
    """The text as pieces in order: plain strings and parsed tool calls."""
    splitter = ToolCallSplitter()
    return _merge_text([*splitter.feed(text), *splitter.flush()])


class ToolCallSplitter:
    def __init__(self):
        self.buffer = ""

    def feed(self, delta: str) -> list[str | ToolCall]:
        self.buffer += delta
        out: list[str | ToolCall] = []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self.buffer, OPEN)
                if len(self.buffer) > keep:
                    out.append(self.buffer[:len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                return out
            if start:
                out.append(self.buffer[:start])
                self.buffer = self.buffer[start:]
            end = self.buffer.find(CLOSE)
            if end < 0:
                return out  # inside a tag: wait for its end
            call = parse_call(self.buffer[len(OPEN):end].strip())
            out.append(call if call is not None else self.buffer[:end + len(CLOSE)])
            self.buffer = self.buffer[end + len(CLOSE):]

    def flush(self) -> list[str]:
        """At the end: whatever is held back (an unclosed tag stays text)."""
        rest, self.buffer = self.buffer, ""
        return [rest] if rest else []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def _merge_text(pieces: list[str | ToolCall]) -> list[str | ToolCall]:
    out: list[str | ToolCall] = []
    for piece in pieces:
        if isinstance(piece, str) and out and isinstance(out[-1], str):
            out[-1] += piece
        elif not isinstance(piece, str) or piece:
            out.append(piece)
    return out
