"""Qwen3-Coder's tool-call format (vLLM's `qwen3_coder` parser): XML-like blocks whose parameters are text,

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A string parameter is written as it is; any other is JSON (a number, true, an object...), read back by the
type its schema gives. tools.py plans and parses with it where the chat template shows `<function=`.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from blink.grammar.reasoning import text_before
from blink.grammar.schema import GrammarError, literal, schema_regex

QWEN3_CODER = "qwen3_coder"
_BLOCK = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.S)
# what a string parameter's text may not hold (it ends the parameter); the grammar keeps every other string
_STRING_ASSERTIONS = {"pattern", "format", "minLength", "maxLength"}


def _value(text: str, schema: Any) -> Any:
    if isinstance(schema, dict) and schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # written as text although the schema says otherwise: kept as the model wrote it


def parse_xml_calls(text: str, schemas: dict[str, dict]) -> tuple[str | None, list[dict]]:
    """(content left over, calls) as tools.parse_tool_calls; a malformed block leaves the text untouched."""
    calls = []
    for block in _BLOCK.finditer(text):
        name, body = block.group(1).strip(), block.group(2)
        if name not in schemas or _PARAM.sub("", body).strip():
            return text, []
        props = schemas[name].get("properties") or {}
        args = {m.group(1).strip(): _value(m.group(2), props.get(m.group(1).strip())) for m in _PARAM.finditer(body)}
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    if not calls:
        return text, []
    return (_BLOCK.sub("", text).strip() or None), calls


def _value_regex(schema: Any, where: str) -> str:
    if isinstance(schema, dict) and schema.get("type") == "string":
        if "enum" in schema or "const" in schema:
            values = schema.get("enum", [schema.get("const")])
            if not all(isinstance(v, str) and v for v in values):
                raise GrammarError(f"{where}: enum values must be non-empty strings")
            return "|".join(literal(v) for v in values)
        if _STRING_ASSERTIONS & set(schema):
            raise GrammarError(f"{where}: {sorted(_STRING_ASSERTIONS & set(schema))[0]} is not enforced on "
                               "qwen3_coder's text parameters")
        return text_before("</parameter>")
    return schema_regex(schema)  # JSON, as the model writes a non-string parameter


def xml_call_regex(name: str, parameters: dict) -> str:
    """One forced call's `<function=...>` element: its parameters in the schema's order, the required ones
    always, the others optionally. Raises GrammarError for what it cannot force."""
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    parts = []
    for key, schema in props.items():
        element = f"<parameter={literal(key)}>\n({_value_regex(schema, key)})\n</parameter>\n"
        parts.append(element if key in required else f"(?:{element})?")
    return f"<function={literal(name)}>\n{''.join(parts)}</function>"
