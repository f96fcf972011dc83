"""The request fields that ask for a constrained output (OpenAI's response_format, vLLM's structured_outputs and
guided_* fields), parsed into one Constraint: 400 naming the field for anything unknown or unsupported, and for more
than one constraint in a request. Compiling and reserving it is structured.py's.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from blink.frontend.errors import APIError
from blink.request import Constraint

_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_STRUCTURED_KEYS = {"json", "regex", "choice", "json_object"}


class StructuredFields(BaseModel):
    """The request fields (completions and chat) that ask for a constrained output."""

    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None


def _schema_constraint(schema: Any, param: str) -> Constraint:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise APIError(400, f"{param}: the schema is not valid JSON ({e})", param) from None
    if not isinstance(schema, dict | bool):
        raise APIError(400, f"{param}: a JSON schema must be an object", param)
    return Constraint("json_schema", json.dumps(schema, sort_keys=True))


def _choice_constraint(choices: Any, param: str) -> Constraint:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise APIError(400, f"{param} must be a non-empty list of non-empty strings", param)
    return Constraint("choice", json.dumps(choices))


def _regex_constraint(regex: Any, param: str) -> Constraint:
    if not isinstance(regex, str) or not regex:
        raise APIError(400, f"{param} must be a non-empty string", param)
    return Constraint("regex", regex)


def _from_response_format(rf: Any) -> Constraint | None:
    if not isinstance(rf, dict):
        raise APIError(400, "response_format must be an object", "response_format")
    kind = rf.get("type")
    extra = set(rf) - {"type", "json_schema"}
    if extra:
        raise APIError(400, f"response_format.{sorted(extra)[0]} is not supported", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise APIError(400, f"unknown response_format.type {kind!r} (text, json_object, json_schema)",
                       "response_format.type")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise APIError(400, "response_format.json_schema.schema is required", "response_format.json_schema")
    unknown = set(spec) - _JSON_SCHEMA_KEYS
    if unknown:
        field = f"response_format.json_schema.{sorted(unknown)[0]}"
        raise APIError(400, f"{field} is not supported", field)
    if "name" in spec and not isinstance(spec["name"], str):
        raise APIError(400, "response_format.json_schema.name must be a string", "response_format.json_schema.name")
    if spec.get("strict") not in (None, True, False):
        raise APIError(400, "response_format.json_schema.strict must be a boolean",
                       "response_format.json_schema.strict")
    # strict or not, the schema is enforced (outputs are always valid: a subset of what strict allows).
    return _schema_constraint(spec["schema"], "response_format.json_schema.schema")


def _from_structured_outputs(so: Any) -> Constraint:
    if not isinstance(so, dict):
        raise APIError(400, "structured_outputs must be an object", "structured_outputs")
    given = {k: v for k, v in so.items() if v not in (None, False)}
    if "grammar" in given:
        raise APIError(400, "structured_outputs.grammar is not supported: blink compiles regular languages "
                            "(JSON schema, regex, choice) into DFAs", "structured_outputs.grammar")
    unknown = set(given) - _STRUCTURED_KEYS
    if unknown:
        field = f"structured_outputs.{sorted(unknown)[0]}"
        raise APIError(400, f"{field} is not supported", field)
    if len(given) != 1:
        raise APIError(400, "structured_outputs needs exactly one of json, regex, choice, json_object",
                       "structured_outputs")
    (key, value), = given.items()
    param = f"structured_outputs.{key}"
    if key == "json":
        return _schema_constraint(value, param)
    if key == "regex":
        return _regex_constraint(value, param)
    if key == "choice":
        return _choice_constraint(value, param)
    return Constraint("json_object")


def constraint_of(body: StructuredFields) -> tuple[Constraint | None, str | None]:
    """The request's constraint and the field it came from; 400 for anything not honoured."""
    for name in ("guided_grammar", "guided_whitespace_pattern"):
        if getattr(body, name) is not None:
            raise APIError(400, f"{name} is not supported", name)
    if body.guided_decoding_backend not in (None, "auto", "outlines"):
        raise APIError(400, "guided_decoding_backend: blink compiles with outlines-core only",
                       "guided_decoding_backend")
    found = []
    if body.response_format is not None:
        c = _from_response_format(body.response_format)
        found.append(("response_format.json_schema.schema" if c and c.kind == "json_schema" else "response_format", c))
    if body.structured_outputs is not None:
        c = _from_structured_outputs(body.structured_outputs)
        found.append(("structured_outputs." + {"json_schema": "json"}.get(c.kind, c.kind), c))
    if body.guided_json is not None:
        found.append(("guided_json", _schema_constraint(body.guided_json, "guided_json")))
    if body.guided_regex is not None:
        found.append(("guided_regex", _regex_constraint(body.guided_regex, "guided_regex")))
    if body.guided_choice is not None:
        found.append(("guided_choice", _choice_constraint(body.guided_choice, "guided_choice")))
    found = [(name, c) for name, c in found if c is not None]
    if len(found) > 1:
        names = ", ".join(n.split(".")[0] for n, _ in found)
        raise APIError(400, f"only one constraint per request: got {names}", found[1][0].split(".")[0])
    return (found[0][1], found[0][0]) if found else (None, None)
