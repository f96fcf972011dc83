"""Structured outputs at the API: a request's constraint (parsed by constraint_fields.py) is
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
import time
import weakref
from collections.abc import AsyncIterator, Callable

from blink.frontend.constraint_fields import StructuredFields, constraint_of
from blink.frontend.errors import APIError
from blink.grammar.arena import GRAMMAR_SLOTS
from blink.grammar.compiler import GrammarTooLarge
from blink.grammar.schema import GrammarError
from blink.request import Constraint, SamplingParams
from blink.transport.grammar_staging import GrammarStaging, StagingFull
from blink.transport.layout import ENGINE_MODE_DEVICE

# A 17th distinct constraint in flight waits for a partition instead of a 503 at once: a burst of requests with
# different schemas is served, later. Polled, because partitions free from the stream's finalizer or from egress.
ARENA_WAIT_S = 60.0
ARENA_POLL_S = 0.02


class ArenaFull(APIError):
    """Every grammar arena partition is held by other constraints (a 503 once the wait is over)."""

    def __init__(self, message: str):
        super().__init__(503, message)


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
                    tool_constraint: Constraint | None = None,
                    wrap: Callable[[Constraint], Constraint] | None = None) -> Constraint | None:
    """Attach the request's constraint to every choice's params (after every check) and reserve it.
    tool_constraint: the grammar of tool_choice required / named (blink/frontend/tools.py).
    wrap: what the request's grammar becomes (a reasoning model's: the grammar after its thinking block)."""
    c, param = constraint_of(body)
    if tool_constraint is not None:
        if c is not None:
            raise APIError(400, f"{param.split('.')[0]} cannot be combined with tool_choice required or a named "
                                "function (the tool call's own grammar applies)", param.split(".")[0])
        c, param = tool_constraint, "tool_choice"
    if c is None:
        return None
    if wrap is not None:
        c = wrap(c)
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
