"""Streaming the tool calls a grammar forces (tool_choice required / named; Anthropic's any / tool).

The grammar (tools.plan_tools) makes the output nothing but calls, `{"name": ..., "arguments" |
"parameters": {...}}` each (Hermes wraps each in <tool_call> tags), so a call can be sent as it is
written, as vLLM streams calls: its id and name once the name is complete, then its arguments' JSON text
piece by piece. Under `auto` nothing forces the shape (a malformed call must fall back to text), so those
calls are held and sent whole at the end (tools.ToolStream).

A call cut by max_tokens leaves its arguments unfinished in the stream; the unstreamed response parses
no call from such text and returns it as content (as the stream does when it is cut before any name).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

# Up to the arguments' first character: what closes the previous call, the opening tag, the name.
_HEAD = re.compile(r'\s*(?:\}\s*)?(?:</tool_call>\s*)?(?:<tool_call>\s*)?\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*'
                   r'"(?:arguments|parameters)"\s*:\s*')


@dataclass
class _Scan:
    """Where a JSON value's text stands: nesting depth and string state (to find where it ends)."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False

    def end(self, text: str) -> int | None:
        """The index just past the value's end in `text`, or None while it goes on."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1  # a bare string value
                continue
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and ch in ",}":  # a bare number, true, false, null
                return i
        return None


@dataclass
class ForcedCallStream:
    """feed() the content as it comes; each call returns OpenAI's `delta.tool_calls` entries to send now."""

    calls: list[dict] = field(default_factory=list)  # id, name and the arguments text so far, in order
    held: str = ""
    scan: _Scan | None = None  # set while a call's arguments are being written

    def feed(self, text: str) -> list[dict]:
        self.held += text
        out = []
        while self.held:
            if self.scan is None:
                head = _HEAD.match(self.held)
                if head is None:
                    break  # the name is not complete yet
                call = {"id": f"call_{uuid.uuid4().hex[:24]}", "name": head.group(1), "arguments": ""}
                self.calls.append(call)
                out.append({"index": len(self.calls) - 1, "id": call["id"], "type": "function",
                            "function": {"name": call["name"], "arguments": ""}})
                self.held, self.scan = self.held[head.end():], _Scan()
                continue
            if not self.scan.started:  # the whitespace before the value is not part of it
                self.held = self.held.lstrip()
                if not self.held:
                    break
            end = self.scan.end(self.held)
            piece = self.held if end is None else self.held[:end]
            self.held = "" if end is None else self.held[end:]
            if end is not None:
                self.scan = None
            if piece:
                self.calls[-1]["arguments"] += piece
                out.append({"index": len(self.calls) - 1, "function": {"arguments": piece}})
        return out

    def finish(self) -> str:
        """Text still held at the end: the output as content when no call began (cut before a name was
        complete, as the unstreamed response returns it); after a call, what is left is dropped."""
        rest, self.held = self.held, ""
        return rest if not self.calls else ""
