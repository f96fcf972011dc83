"""Host mode: the conventional architecture. A Python scheduler on the CPU decides every step and
replays the forward graphs from the host (what vLLM and SGLang do); on a machine without a GPU it runs
the model eagerly with the torch reference kernels."""
from __future__ import annotations

import random
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait
from concurrent.futures.process import BrokenProcessPool

from blink.config import EngineArgs
from blink.engine.interface import Engine, EngineStats, StepTime, TokenEvent
from blink.engine.loaded_model import LoadedModel
from blink.engine.runner import ModelRunner, SampledToken
from blink.engine.scheduler import Scheduler
from blink.engine.sequence import SeqStatus, Sequence
from blink.engine.stops import check_stop
from blink.grammar.arena import GrammarArena
from blink.grammar.worker import COMPILE_TIMEOUT_S
from blink.request import FinishReason, SamplingParams

PARK_WAIT_S = 2e-3  # an engine with only compiling requests waits this long per step() for one
STEP_TIMES_KEPT = 8192  # the last steps' durations, for benchmarks (blink bench barrier)


class HostEngine(Engine):
    def __init__(self, args: EngineArgs, loaded: LoadedModel | None = None):
        self.args = args
        self.tp = None  # rank 0's TensorParallelRunner when --tensor-parallel-size > 1
        if args.tensor_parallel_size > 1:
            if loaded is not None:
                raise ValueError("a preloaded model cannot be used with tensor parallelism")
            from blink.parallel.host_runner import start_tensor_parallel

            self.m, self.tp = start_tensor_parallel(args)
        else:
            self.m = loaded or LoadedModel.load(args)
        m = self.m
        self.scheduler = Scheduler(m.kv_cache.num_blocks, args.block_size, args.max_num_seqs,
                                   m.max_num_batched_tokens)
        # The TP runner has ModelRunner's execute() and mirrors each step on the other ranks.
        self.runner = self.tp or ModelRunner(
            m.model, m.kv_cache, m.sampling_state, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=m.max_num_batched_tokens, max_model_len=m.max_model_len,
            device=m.device, use_graphs=m.device == "cuda" and not args.enforce_eager)
        self.seqs: dict[int, Sequence] = {}
        self._pending: list[TokenEvent] = []  # finish events of aborts, returned by the next step()
        self._arrivals = 0
        self._steps = 0
        self._tokens = 0
        self._rng = random.Random(args.seed)
        self._step_times: deque[StepTime] = deque(maxlen=STEP_TIMES_KEPT)
        self.grammars = GrammarArena(m.sampling_state)
        self._compiles = None  # blink/grammar/worker.py CompilePool, started by the first constraint
        self._parked: dict[int, tuple] = {}  # req_id -> (future, prompt, params, submitted at): compiling

    # -- Engine interface ------------------------------------------------------------------------------
    def add_request(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        if req_id in self.seqs:
            raise ValueError(f"request id {req_id} is already in use")
        self.m.validate_prompt(prompt_ids, params)
        if params.constraint is not None:  # compiled in a worker process; queued once its tables are here
            if req_id in self._parked:
                raise ValueError(f"request id {req_id} is already in use")
            future = self._compile_pool().submit(params.constraint)
            self._parked[req_id] = (future, list(prompt_ids), params, time.monotonic())
            return
        self._queue(req_id, prompt_ids, params)

    def _queue(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        self._arrivals += 1
        seq = Sequence(req_id, list(prompt_ids), params, seed, self._arrivals)
        self.seqs[req_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, req_id: int) -> None:
        parked = self._parked.pop(req_id, None)
        if parked is not None:
            parked[0].cancel()
            self._pending.append(TokenEvent(req_id, -1, 0, FinishReason.ABORT))
            return
        seq = self.seqs.pop(req_id, None)
        if seq is None:
            return  # finished already, or never existed: nothing to free
        self.scheduler.finish(seq)
        self._release_grammar(seq)
        self._pending.append(TokenEvent(req_id, -1, len(seq.output_ids), FinishReason.ABORT))

    def has_unfinished(self) -> bool:
        return bool(self._pending) or bool(self._parked) or self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(len(s.running), len(s.waiting), s.blocks.num_free, s.blocks.num_blocks,
                           self._steps, self._tokens, s.num_preemptions)

    def step_times(self) -> list[StepTime]:
        """The last STEP_TIMES_KEPT steps that ran, oldest first (one per stats().steps increment)."""
        return list(self._step_times)

    def step(self) -> list[TokenEvent]:
        # The read-back of the sampled tokens already waits for the step: timing it adds no sync.
        start = time.perf_counter()
        self._unpark()
        events, self._pending = self._pending, []
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return events
        for seq in plan.admitted:  # a re-admission (preempted) walks the automaton over its output so far
            c = seq.params.constraint
            grammar = self.grammars.slot_grammar(c, seq.output_ids) if c is not None else None
            self.m.sampling_state.set_slot(seq.slot, seq.params, seq.seed, seq.prompt_ids, seq.output_ids, grammar)
        want_top = max((c.seq.params.logprobs or 0) for c in plan.chunks)
        sampled = self.runner.execute(plan, want_top)
        self.scheduler.complete(plan)
        self._steps += 1
        for chunk, tok in zip(plan.chunks, sampled, strict=True):
            if tok is not None:
                events.append(self._append(chunk.seq, tok))
        self._step_times.append(StepTime(time.perf_counter() - start, plan.num_tokens, len(plan.chunks)))
        return events

    def shutdown(self) -> None:
        if self._compiles is not None:
            self._compiles.shutdown()
        if self.tp is not None:
            self.tp.shutdown()

    # -- helpers ------------------------------------------------------------------------------------------
    def _append(self, seq: Sequence, tok: SampledToken) -> TokenEvent:
        seq.output_ids.append(tok.token_id)
        self._tokens += 1
        reason = check_stop(seq.params, seq.output_ids, seq.num_tokens, self.m.eos_token_ids,
                            self.m.max_model_len)
        k = seq.params.logprobs or 0
        event = TokenEvent(seq.req_id, tok.token_id, len(seq.output_ids) - 1, reason, tok.logprob,
                           tok.top_ids[:k], tok.top_logprobs[:k])
        if reason != FinishReason.NONE:
            self.scheduler.finish(seq)
            self._release_grammar(seq)
            del self.seqs[seq.req_id]
        assert seq.status in (SeqStatus.RUNNING, SeqStatus.FINISHED)
        return event

    def _release_grammar(self, seq: Sequence) -> None:
        if seq.params.constraint is not None:
            self.grammars.release(seq.params.constraint)

    def _compile_pool(self):
        if self._compiles is None:
            from blink.grammar.worker import CompilePool
            from blink.model.demo import ensure_default_model

            if self.tp is not None:
                raise ValueError("structured outputs are not supported with tensor parallelism yet")
            self._compiles = CompilePool(self.args.model or str(ensure_default_model()), self.args.tokenizer,
                                         self.m.vocab_size, self.m.eos_token_ids, self.args.grammar_arena_mb << 20)
        return self._compiles

    def _unpark(self) -> None:
        """Queue the constrained requests whose tables arrived (a refused one ends with ERROR)."""
        if not self._parked:
            return
        if not self.scheduler.has_unfinished() and not self._pending:  # nothing else to do: wait a little
            wait([p[0] for p in self._parked.values()], timeout=PARK_WAIT_S, return_when=FIRST_COMPLETED)
        for req_id, (future, prompt_ids, params, since) in list(self._parked.items()):
            if not future.done() and time.monotonic() - since > COMPILE_TIMEOUT_S:
                self._compiles.kill()  # a runaway compile: its request (and any queued behind it) fail
            if not future.done():
                continue
            del self._parked[req_id]
            try:
                self.grammars.acquire(params.constraint, future.result())
            except (ValueError, BrokenProcessPool, CancelledError):  # refused, killed, or ArenaFull (the
                # front end checks and mirrors the arena first, so this is a request it could not judge)
                self._pending.append(TokenEvent(req_id, -1, 0, FinishReason.ERROR))
                continue
            self._queue(req_id, prompt_ids, params)
