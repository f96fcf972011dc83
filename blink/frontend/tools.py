"""Tool calling on chat: tools, tool_choice, parallel_tool_calls -> a grammar and a parser.

The model family's format comes from its chat template: Hermes/Qwen (`<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>`, one block per call), Qwen3-Coder (XML-like parameters in the same tags:
tool_xml.py) or Llama 3 (a bare JSON object `{"name": ..., "parameters": {...}}`, one call: Llama 3's
templates describe no parallel form).
`required` and a named function are enforced by a regex built from the tools' JSON schemas, so the
calls parse and their arguments validate even with random weights; `auto` leaves the output free and
parses what the model wrote (with parallel calls off, only its first call counts, as in vLLM); `none`
neither constrains nor parses. The chat and Anthropic Messages endpoints both plan and parse here.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from blink.frontend.errors import APIError
from blink.frontend.tool_xml import QWEN3_CODER, parse_xml_calls, xml_call_regex
from blink.grammar.schema import GrammarError, schema_regex
from blink.request import Constraint
from blink.text.detokenizer import held_back

MAX_PARALLEL_CALLS = 4  # calls one constrained answer may hold (each repeat grows the automaton)
HERMES, LLAMA3 = "hermes", "llama3"
TOOL_PARSERS = {"hermes": HERMES, "llama3_json": LLAMA3, QWEN3_CODER: QWEN3_CODER}  # vLLM's names -> formats
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class ToolFields(BaseModel):
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


def tool_format(template_source: str | None) -> str:
    """The call format a chat template shows (--tool-call-parser overrides it: FrontendState.tool_format)."""
    if template_source and "<function=" in template_source:
        return QWEN3_CODER
    if template_source and "<|python_tag|>" in template_source and _HERMES_OPEN not in template_source:
        return LLAMA3
    return HERMES  # Qwen, Hermes, and the default for templates that show no format of their own


@dataclass
class ToolPlan:
    """What the request asks: which format, whether to parse, and the grammar (required/named)."""

    fmt: str
    parse: bool
    constraint: Constraint | None
    schemas: dict[str, dict] = field(default_factory=dict)  # the callable functions' parameters, by name
    parallel: bool = True  # false: one call at most (the grammar forces it; under auto the first is kept)

    @property
    def names(self) -> set[str]:
        """The functions a call may name."""
        return set(self.schemas)


def _check_tools(tools: Any) -> dict[str, dict]:
    if not isinstance(tools, list) or not tools:
        raise APIError(400, "tools must be a non-empty list", "tools")
    out = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise APIError(400, f"tools[{i}].function.name must match [A-Za-z0-9_.-]{{1,64}}",
                           f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                           f"tools[{i}].function.parameters")
        out[name] = {"index": i, "parameters": params}
    return out


def _call_regex(name: str, index: int, params: dict, fmt: str) -> str:
    if fmt == QWEN3_CODER:
        try:
            return xml_call_regex(name, params)
        except GrammarError as e:
            raise APIError(400, f"tools[{index}].function.parameters: {e}",
                           f"tools[{index}].function.parameters") from None
    args_key = "parameters" if fmt == LLAMA3 else "arguments"
    schema = {"type": "object", "properties": {"name": {"const": name}, args_key: params},
              "required": ["name", args_key], "additionalProperties": False}
    try:
        return schema_regex(schema)
    except GrammarError as e:
        raise APIError(400, f"tools[{index}].function.parameters: {e}", f"tools[{index}].function.parameters") from None


def plan_tools(tools: Any, tool_choice: Any, parallel: bool | None, fmt: str) -> ToolPlan | None:
    """None when the request has no tools; 400 for a malformed choice or an unknown function.
    fmt: HERMES, LLAMA3 or QWEN3_CODER, the server's (FrontendState.tool_format)."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", "tool_choice")
        return None
    by_name = _check_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan(fmt, parse=False, constraint=None)
    if choice == "auto":
        return ToolPlan(fmt, parse=True, constraint=None, parallel=parallel is not False,
                        schemas={n: t["parameters"] for n, t in by_name.items()})
    if choice == "required":
        wanted = list(by_name)
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in by_name:
            raise APIError(400, f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        wanted = [name]
    else:
        raise APIError(400, "tool_choice must be none, auto, required or {'type': 'function', 'function': "
                            "{'name': ...}}", "tool_choice")
    one = "|".join(f"({_call_regex(n, by_name[n]['index'], by_name[n]['parameters'], fmt)})" for n in wanted)
    if fmt == LLAMA3:
        regex = f"({one})"
    else:
        block = f"{_HERMES_OPEN}\n({one})\n{_HERMES_CLOSE}"
        extra = MAX_PARALLEL_CALLS - 1 if parallel is not False else 0
        regex = f"{block}(\n{block}){{0,{extra}}}" if extra else block
    return ToolPlan(fmt, parse=True, constraint=Constraint("regex", regex), parallel=parallel is not False,
                    schemas={n: by_name[n]["parameters"] for n in wanted})


def _as_call(obj: Any, fmt: str, names: set[str]) -> dict | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("parameters", obj.get("arguments")) if fmt == LLAMA3 else obj.get("arguments")
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[dict]]:
    """(content left over, tool calls) from a finished output; no calls: the text is the content."""
    if plan.fmt == LLAMA3:
        calls = _llama3_calls(text.strip().removeprefix("<|python_tag|>").strip(), plan)
        return (None, calls if plan.parallel else calls[:1]) if calls else (text, [])
    if plan.fmt == QWEN3_CODER:
        rest, calls = parse_xml_calls(text, plan.schemas)
        return rest, (calls if plan.parallel else calls[:1])
    calls = []
    for match in _HERMES_BLOCK.finditer(text):
        try:
            call = _as_call(json.loads(match.group(1)), plan.fmt, plan.names)
        except json.JSONDecodeError:
            call = None
        if call is None:
            return text, []  # a malformed block: hand the text back untouched rather than guess
        calls.append(call)
    if not calls:
        return text, []
    rest = _HERMES_BLOCK.sub("", text).strip()
    return (rest or None), (calls if plan.parallel else calls[:1])


def _llama3_calls(body: str, plan: ToolPlan) -> list[dict]:
    """Llama 3's JSON calls: one object, or several separated by `;` (as vLLM's llama3_json reads them);
    [] unless the whole body is calls."""
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return []
        call = _as_call(obj, plan.fmt, plan.names)
        if call is None:
            return []
        calls.append(call)
        rest = body[at:].lstrip()
        if rest and not rest.startswith(";"):
            return []
        at = len(body) - len(rest.removeprefix(";").lstrip())
    return calls


class ToolStream:
    """Streaming: content passes through until a tool call may begin; from there the text is held and
    parsed at the end (a call's arguments arrive whole, in one delta per call, as OpenAI's shape allows)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.held = ""
        self.holding = False

    def feed(self, text: str) -> str:
        """Content that is safe to send now."""
        if self.holding:
            self.held += text
            return ""
        self.held += text
        tagged = self.plan.fmt != LLAMA3  # Hermes and Qwen3-Coder open each call with <tool_call>
        opener = _HERMES_OPEN if tagged else "{"
        at = self.held.find(opener) if tagged else (0 if self.held.lstrip()[:1] in ("{", "<") else -1)
        if at >= 0:
            out, self.held, self.holding = self.held[:at], self.held[at:], True
            return out
        if self.plan.fmt == LLAMA3:
            if not self.held.strip():
                return ""  # only whitespace so far: a call may still start
            out, self.held = self.held, ""
            return out
        keep = held_back(self.held, (opener,))  # a prefix of the opener may be starting
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to send, tool calls) once the output is complete."""
        content, calls = parse_tool_calls(self.held, self.plan) if self.held else (None, [])
        return content or "", calls
