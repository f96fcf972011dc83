"""JSON schema, json_object, choice -> one regex (outlines-core's JSON-schema translation, checked first).

outlines-core silently ignores some keywords (integer minimum/maximum, multipleOf, uniqueItems, ...), and
a keyword accepted but not enforced would be a silent lie: every keyword is checked against the list of
what is enforced, anything else raises GrammarError naming it. Bounded integers are written here
(int_range) and spliced in through a string-pattern placeholder.

json_object is recursive; blink keeps a DFA (no stack on the GPU: one table lookup per token) and bounds
the nesting depth at JSON_OBJECT_DEPTH, outlines' own bounded-recursion translation of {"type": "object"}.
"""
from __future__ import annotations

import json
import re

import jsonschema

from blink.grammar.int_range import integer_range_regex

WHITESPACE = r"[ ]?"  # at most one space between tokens: a random model cannot pad forever
JSON_OBJECT_DEPTH = 2  # nesting levels below the top object (each level multiplies the DFA's size)
_PLACEHOLDER = "BLINKINT{}Q"
MAX_REGEX_CHARS = 40_000  # a compile budget: outlines' DFA construction grows fast past this (seconds to minutes)
# The empty schema, spelled so that outlines groups it: its own translation of {} is an ungrouped
# alternation that, inside an object, lets a bare value replace the whole object (outlines-core 0.2.14).
_ANY = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "array", "object")]}

# Keywords of the JSON Schema vocabularies (drafts 4 to 2020-12) that constrain instances. Of these,
# the ones outside _ENFORCED are refused; any other keyword is an annotation (the spec says to ignore
# unknown keywords) and is dropped before outlines sees it.
_ASSERTIONS = {"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
               "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains",
               "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "dependencies",
               "contains", "items", "additionalItems", "prefixItems", "unevaluatedItems", "unevaluatedProperties",
               "properties", "patternProperties", "additionalProperties", "propertyNames", "allOf", "anyOf",
               "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef",
               "format", "$defs", "definitions"}
_ENFORCED = {"type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
             "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf", "allOf",
             "$ref", "$defs", "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
_FORMATS = {"date-time", "date", "time", "uuid", "email", "uri"}
_INT_FORMATS = {"int32": 31, "int64": 63}  # OpenAPI's integer formats: enforced as bounds
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


class GrammarError(ValueError):
    """A constraint blink cannot honour; the message names the offending part."""


class GrammarTooLarge(GrammarError):
    """Too big for one arena partition, or past the compile budget, even with the arena empty (a 400)."""


def _check(node, path: str, counter: list[int]) -> object:
    """Validate keywords recursively; returns the node with bounded integers turned into placeholders."""
    if node is True:
        return _ANY
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise GrammarError(f"{path or '/'}: a schema must be an object or a boolean")
    for key in node:
        if key in _ASSERTIONS and key not in _ENFORCED:
            raise GrammarError(f"unsupported JSON schema keyword '{key}' at {path or '/'}")
    out = {k: v for k, v in node.items() if k in _ENFORCED}
    fmt = node.get("format")
    if fmt in _INT_FORMATS and node.get("type") == "integer":
        bits = _INT_FORMATS[fmt]
        node = {**node, "minimum": max(node.get("minimum", -(1 << bits)), -(1 << bits)),
                "maximum": min(node.get("maximum", (1 << bits) - 1), (1 << bits) - 1)}
        node.pop("format")
        fmt = None
    if fmt is not None and fmt not in _FORMATS:
        raise GrammarError(f"unsupported JSON schema format '{fmt}' at {path or '/'}")
    bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in node]
    if bounds:
        if node.get("type") != "integer":
            raise GrammarError(f"'{bounds[0]}' at {path or '/'} is supported only with \"type\": \"integer\"")
        return _bounded_integer(node, path, counter)
    for key in _SUBSCHEMA_MAPS:
        if key in node:
            out[key] = {name: _check(sub, f"{path}/{key}/{name}", counter) for name, sub in node[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if key in node:
            out[key] = [_check(sub, f"{path}/{key}/{i}", counter) for i, sub in enumerate(node[key])]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _check(node[key], f"{path}/{key}", counter)
    return out or _ANY


def _bounded_integer(node: dict, path: str, counter: list[int]) -> dict:
    def as_int(key: str, rounding) -> int | None:
        value = node.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GrammarError(f"'{key}' at {path or '/'} must be a number")
        return rounding(value)

    import math

    lo, hi = as_int("minimum", math.ceil), as_int("maximum", math.floor)
    ex_lo, ex_hi = as_int("exclusiveMinimum", math.floor), as_int("exclusiveMaximum", math.ceil)
    if ex_lo is not None:
        lo = ex_lo + 1 if lo is None else max(lo, ex_lo + 1)
    if ex_hi is not None:
        hi = ex_hi - 1 if hi is None else min(hi, ex_hi - 1)
    try:
        regex = integer_range_regex(lo, hi)
    except ValueError as e:
        raise GrammarError(f"{path or '/'}: {e}") from None
    counter.append(regex)
    return {"type": "string", "pattern": _PLACEHOLDER.format(len(counter) - 1)}


def schema_regex(schema: object) -> str:
    """The regex of every JSON text blink lets a request produce for `schema` (a parsed JSON value)."""
    if isinstance(schema, dict) and schema.get("type") == "object" and not set(schema) & (_ASSERTIONS - {"type"}):
        return json_object_regex()
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise GrammarError(f"invalid JSON schema: {e.message}") from None
    spliced: list[str] = []
    checked = _check(schema, "", spliced)
    try:
        regex = _outlines_regex(checked, WHITESPACE, 3)
    except ValueError as e:
        raise GrammarError(f"unsupported JSON schema: {str(e).splitlines()[0]}") from None
    if len(regex) > MAX_REGEX_CHARS:
        raise GrammarTooLarge(f"the schema is too complex: its regex has {len(regex)} characters "
                              f"(at most {MAX_REGEX_CHARS})")
    for i, part in enumerate(spliced):
        quoted = f'"{_PLACEHOLDER.format(i)}"'
        if quoted not in regex:
            raise GrammarError("unsupported JSON schema: a bounded integer sits where blink cannot place it")
        regex = regex.replace(quoted, f"({part})")
    return regex


def json_object_regex() -> str:
    """Any JSON object, nested at most JSON_OBJECT_DEPTH levels below the top."""
    return _outlines_regex({"type": "object"}, WHITESPACE, JSON_OBJECT_DEPTH)


def _outlines_regex(schema: object, whitespace: str, depth: int) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    return build_regex_from_schema(json.dumps(schema), whitespace, depth)


# Escaped everywhere: metacharacters of Python's re and of Rust's regex (outlines-core), including the
# class set operators (&&, --, ~~). Never escape letters, digits, "<" or ">" ("\<" is an assertion in Rust).
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def literal_char(ch: str) -> str:
    """One literal character, valid in and out of a class in both regex dialects."""
    if ch in _REGEX_META:
        return "\\" + ch
    if not ch.isprintable():  # newline, tab...: by code in both dialects
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 \
            else f"\\U{ord(ch):08x}"
    return ch


def literal(text: str) -> str:
    """`text` as a regex that matches it alone (outlines-core's dialect and Python's)."""
    return "".join(literal_char(ch) for ch in text)


def choice_regex(choices: list[str]) -> str:
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice must be a non-empty list of non-empty strings")
    return "|".join(literal(c) for c in choices)


def check_regex(regex: str) -> str:
    """A cheap syntax check with Python's re (outlines-core reports the rest when it builds the DFA)."""
    if not isinstance(regex, str) or not regex:
        raise GrammarError("regex must be a non-empty string")
    try:
        re.compile(regex)
    except re.error as e:
        raise GrammarError(f"invalid regex: {e}") from None
    return regex
