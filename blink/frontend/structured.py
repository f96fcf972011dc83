"""Structured outputs at the API: OpenAI's response_format, vLLM's structured_outputs and guided_* fields.

Each request's constraint is parsed here (400 naming the field for anything unknown or unsupported),
compiled once (a worker process, cached: the same compiler the engine uses, so a 400 here means the
engine would refuse too), and counted against the engine's grammar arena: the arena has a fixed
number of partitions (blink/grammar/arena.py); while every one is taken by other constraints a request
waits for one (as vLLM queues it), and gets a 503 only after ARENA_WAIT_S.
- Host mode: the front end mirrors which constraints are in flight; the engine compiles again and loads
  its arena itself, acquiring after and releasing before the front end does (ring order).
- Device mode: the front end is the allocator. Its compile returns the tables, which it writes into the
  segment's grammar staging slot of the chosen partition (blink/transport/grammar_staging.py); the GPU
  scheduler copies them into its arena at admission. A slot is held from the reservation here until the
  stream ends and, once submitted, until the request's last egress record.
"""
from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from blink.frontend.errors import APIError
from blink.grammar.arena import GRAMMAR_SLOTS
from blink.grammar.compiler import GrammarTooLarge
from blink.grammar.schema import GrammarError
from blink.request import Constraint, SamplingParams
from blink.transport.grammar_staging import GrammarStaging, StagingFull
from blink.transport.layout import ENGINE_MODE_DEVICE

_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
# A 17th distinct constraint in flight waits for a partition instead of a 503 at once: a burst of requests with
# different schemas is served, later. Polled, because partitions free from the stream's finalizer or from egress.
ARENA_WAIT_S = 60.0
ARENA_POLL_S = 0.02


class ArenaFull(APIError):
    """Every grammar arena partition is held by other constraints (a 503 once the wait is over)."""

    def __init__(self, message: str):
        super().__init__(503, message)
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


class StructuredOutputs:
    """The front end's compiler and its mirror of the engine's arena partitions."""

    def __init__(self, tokenizer, model: str, arena_bytes: int, tokenizer_dir: str | None = None):
        self._tokenizer, self._model, self._arena_bytes = tokenizer, model, arena_bytes
        self._tokenizer_dir = tokenizer_dir
        self._pool = None  # blink/text/grammar_worker.py: compiles off this process's GIL
        self._in_flight: dict[Constraint, int] = {}  # host mode's mirror
        self._staging: GrammarStaging | None = None  # device mode's allocator (the engine's segment)
        self.waiting = 0  # requests in reserve_waiting's wait (the blink:grammar_arena_waiting gauge)

    async def check(self, c: Constraint, param: str, want_tables: bool = False):
        """Compile `c` (400 naming `param` if it cannot be); the tables when want_tables (device mode)."""
        if self._arena_bytes <= 0:
            raise APIError(400, f"{param}: structured outputs are off on this server (--grammar-arena-mb 0)", param)
        if self._pool is None:
            from blink.text.grammar_setup import model_eos_ids
            from blink.text.grammar_worker import CompilePool

            self._pool = CompilePool(self._model, self._tokenizer_dir, self._tokenizer.vocab_size,
                                     model_eos_ids(self._model), self._arena_bytes)
        from concurrent.futures.process import BrokenProcessPool

        from blink.text.grammar_worker import COMPILE_TIMEOUT_S, too_complex

        try:
            try:
                return await asyncio.wait_for(asyncio.wrap_future(self._pool.submit(c, want_tables=want_tables)),
                                              COMPILE_TIMEOUT_S)
            except (TimeoutError, BrokenProcessPool, MemoryError):
                self._pool.kill()
                raise too_complex(COMPILE_TIMEOUT_S) from None
        except GrammarTooLarge as e:
            raise APIError(400, f"{param}: {e}", param) from None
        except GrammarError as e:
            raise APIError(400, f"{param}: {e}", param) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def reserve(self, c: Constraint, staging: GrammarStaging | None = None, tables=None) -> None:
        """Count one choice of `c` against the arena (503 when full); device mode: stage its tables."""
        if staging is not None:
            self._staging = staging
            try:
                staging.reserve(c, tables.token_class, tables.next_state)
            except StagingFull as e:
                raise ArenaFull(str(e)) from None
            except ValueError as e:  # tables the engine's staging cannot carry (another vocabulary)
                raise APIError(400, str(e)) from None
            return
        if c not in self._in_flight and len(self._in_flight) >= GRAMMAR_SLOTS:
            raise ArenaFull(f"all {GRAMMAR_SLOTS} grammar arena partitions are in use by other constrained "
                            "requests; retry shortly")
        self._in_flight[c] = self._in_flight.get(c, 0) + 1

    async def reserve_waiting(self, c: Constraint, staging: GrammarStaging | None = None, tables=None,
                              wait_s: float | None = None) -> None:
        """reserve, waiting while the arena is full (up to wait_s, ARENA_WAIT_S by default; then the 503)."""
        deadline = time.monotonic() + (ARENA_WAIT_S if wait_s is None else wait_s)
        try:
            return self.reserve(c, staging, tables)
        except ArenaFull:
            pass
        self.waiting += 1
        try:
            while True:
                await asyncio.sleep(ARENA_POLL_S)
                try:
                    return self.reserve(c, staging, tables)
                except ArenaFull:
                    if time.monotonic() >= deadline:
                        raise
        finally:
            self.waiting -= 1

    def release(self, c: Constraint) -> None:
        if self._staging is not None:  # a submitted request keeps holding the slot until its last record
            self._staging.unreserve(c)
            return
        left = self._in_flight[c] - 1
        if left:
            self._in_flight[c] = left
        else:
            del self._in_flight[c]

    def hold(self, c: Constraint | None, stream: AsyncIterator) -> AsyncIterator:
        """`stream`, releasing its reservation when it ends (or is dropped without ever running)."""
        if c is None:
            return stream
        released = [False]

        def release() -> None:
            if not released[0]:
                released[0] = True
                self.release(c)

        async def held():
            try:
                async for item in stream:
                    yield item
            finally:
                release()

        wrapper = held()
        weakref.finalize(wrapper, release)
        return wrapper


async def constrain(state, body: StructuredFields, params: list[SamplingParams],
                    tool_constraint: Constraint | None = None) -> Constraint | None:
    """Attach the request's constraint to every choice's params (after every check) and reserve it.
    tool_constraint: the grammar of tool_choice required / named (blink/frontend/tools.py)."""
    c, param = constraint_of(body)
    if tool_constraint is not None:
        if c is not None:
            raise APIError(400, f"{param.split('.')[0]} cannot be combined with tool_choice required or a named "
                                "function (the tool call's own grammar applies)", param.split(".")[0])
        c, param = tool_constraint, "tool_choice"
    if c is None:
        return None
    structured = state.structured
    if structured is None:
        raise APIError(400, f"{param}: structured outputs are not available on this server", param)
    staging = None
    if int(state.client.control.engine_mode) == ENGINE_MODE_DEVICE:  # the GPU gets compiled tables
        staging = GrammarStaging.of(state.client.segment)
        if staging is None:
            raise APIError(400, f"{param}: structured outputs are off on this server (no grammar staging)", param)
    tables = await structured.check(c, param, want_tables=staging is not None)
    for p in params:
        p.constraint = c
        try:
            p.validate()
        except ValueError as e:
            raise APIError(400, str(e), param) from None
    await structured.reserve_waiting(c, staging, tables)  # the first choice may wait; the others share its slot
    for k in range(1, len(params)):
        try:
            structured.reserve(c, staging, tables)
        except APIError:
            for _ in range(k):  # all choices or none
                structured.release(c)
            raise
    return c


def hold(state, c: Constraint | None, stream: AsyncIterator) -> AsyncIterator:
    """A choice's stream that gives its arena reservation back when it ends."""
    return stream if c is None else state.structured.hold(c, stream)
