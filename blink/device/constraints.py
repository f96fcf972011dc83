"""Device mode's structured outputs in process (DeviceEngine: `blink generate`, the offline LLM, tests).

Per request, on the CPU: the constraint is compiled once (a worker process, cached, as host mode's
ConstraintLoader) and its tables are staged in the segment (blink/transport/grammar_staging.py) before the
descriptor goes out; the GPU scheduler copies them into its arena at admission and masks and advances
inside the captured graphs, so nothing here runs per token. Under `blink serve` the front end does the
same (frontend/structured.py).
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

from blink.grammar.tables import GrammarTables
from blink.request import Constraint
from blink.transport.grammar_staging import GrammarStaging, StagingFull
from blink.transport.shm import Segment


class DeviceConstraints:
    def __init__(self, args, loaded, segment: Segment):
        self.args, self.m = args, loaded
        self.staging = GrammarStaging.of(segment)
        self._compiles = None  # blink/text/grammar_worker.py CompilePool, started by the first constraint

    def tables(self, c: Constraint) -> GrammarTables:
        """The compiled tables; GrammarError (a ValueError) when the constraint is refused."""
        from blink.grammar.schema import GrammarError
        from blink.text.grammar_worker import COMPILE_TIMEOUT_S, too_complex

        if self.staging is None:
            raise GrammarError("structured outputs are off on this engine (--grammar-arena-mb 0)")
        try:
            return self._compile_pool().submit(c).result(timeout=COMPILE_TIMEOUT_S)
        except (FutureTimeout, BrokenProcessPool, MemoryError):
            self._compiles.kill()  # a runaway compile: the next request gets a fresh worker
            raise too_complex(COMPILE_TIMEOUT_S) from None

    def reserve(self, c: Constraint, tables: GrammarTables, wait: Callable[[], bool]) -> None:
        """Stage `c`'s tables; while every slot is held, call wait() (it drains egress, which frees slots as
        requests finish) until it returns False (nothing left that could free one: StagingFull)."""
        while True:
            try:
                self.staging.reserve(c, tables.token_class, tables.next_state)
                return
            except StagingFull:
                if not wait():
                    raise

    def unreserve(self, c: Constraint) -> None:
        self.staging.unreserve(c)  # the submitted request holds the slot until its last record

    def shutdown(self) -> None:
        if self._compiles is not None:
            self._compiles.shutdown()

    def _compile_pool(self):
        if self._compiles is None:
            from blink.text.grammar_worker import CompilePool

            self._compiles = CompilePool.for_engine(self.args, self.m)
        return self._compiles
