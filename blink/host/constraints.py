"""Host mode's structured outputs: a constrained request waits here while its grammar compiles (in a
worker process, per request, off the step), then its tables are loaded into the GPU arena (shared by
identical constraints) and the request is queued. After the step nothing of this runs per token: the
mask and the automaton's advance are inside the sampling kernels of the captured graph."""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait
from concurrent.futures.process import BrokenProcessPool

from blink.grammar.arena import GrammarArena
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.text.grammar_worker import COMPILE_TIMEOUT_S

PARK_WAIT_S = 2e-3  # an engine with only compiling requests waits this long per step() for one


class ConstraintLoader:
    def __init__(self, args, loaded, tensor_parallel: bool):
        self.args, self.m, self.tensor_parallel = args, loaded, tensor_parallel
        self.arena = GrammarArena(loaded.sampling_state)
        self._compiles = None  # blink/text/grammar_worker.py CompilePool, started by the first constraint
        self._parked: dict[int, tuple] = {}  # req_id -> (future, prompt, params, submitted at): compiling

    def park(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        if req_id in self._parked:
            raise ValueError(f"request id {req_id} is already in use")
        future = self._compile_pool().submit(params.constraint)
        self._parked[req_id] = (future, list(prompt_ids), params, time.perf_counter())

    def abort(self, req_id: int) -> TokenEvent | None:
        parked = self._parked.pop(req_id, None)
        if parked is None:
            return None
        parked[0].cancel()
        return TokenEvent(req_id, -1, 0, FinishReason.ABORT)

    def has_parked(self) -> bool:
        return bool(self._parked)

    def ready(self, idle: bool) -> tuple[list[tuple[int, list[int], SamplingParams, float]], list[TokenEvent]]:
        """The requests whose tables arrived and are loaded (to queue, with their arrival's perf_counter), and
        the ERROR events of refused ones. idle: nothing else to do, so wait a little for a compile."""
        if not self._parked:
            return [], []
        if idle:
            wait([p[0] for p in self._parked.values()], timeout=PARK_WAIT_S, return_when=FIRST_COMPLETED)
        queued, failed = [], []
        for req_id, (future, prompt_ids, params, since) in list(self._parked.items()):
            if not future.done() and time.perf_counter() - since > COMPILE_TIMEOUT_S:
                self._compiles.kill()  # a runaway compile: its request (and any queued behind it) fail
            if not future.done():
                continue
            del self._parked[req_id]
            try:
                self.arena.acquire(params.constraint, future.result())
            except (ValueError, BrokenProcessPool, CancelledError):  # refused, killed, or ArenaFull (the
                # front end checks and mirrors the arena first, so this is a request it could not judge)
                failed.append(TokenEvent(req_id, -1, 0, FinishReason.ERROR))
                continue
            queued.append((req_id, prompt_ids, params, since))
        return queued, failed

    def slot_grammar(self, params: SamplingParams, output_ids: list[int]) -> tuple[int, int] | None:
        """(grammar id, automaton state after output_ids) for set_slot; a re-admission walks the output."""
        c = params.constraint
        return self.arena.slot_grammar(c, output_ids) if c is not None else None

    def release(self, params: SamplingParams) -> None:
        if params.constraint is not None:
            self.arena.release(params.constraint)

    def shutdown(self) -> None:
        if self._compiles is not None:
            self._compiles.shutdown()

    def _compile_pool(self):
        if self._compiles is None:
            from blink.text.grammar_worker import CompilePool

            if self.tensor_parallel:
                raise ValueError("structured outputs are not supported with tensor parallelism yet")
            self._compiles = CompilePool.for_engine(self.args, self.m)
        return self._compiles
