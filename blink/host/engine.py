"""Host mode: the conventional architecture. A Python scheduler on the CPU decides every step and
replays the forward graphs from the host (what vLLM and SGLang do); on a machine without a GPU it runs
the model eagerly with the torch reference kernels."""
from __future__ import annotations

import bisect
import time
from collections import deque

from blink.config import EngineArgs
from blink.core.interface import Engine, EngineStats, StepTime
from blink.core.loaded_model import LoadedModel
from blink.core.runner import ModelRunner
from blink.core.scheduler import Scheduler
from blink.core.sequence import Sequence
from blink.host.constraints import ConstraintLoader
from blink.host.pace import PACE_SLICE_S, DecodePace
from blink.request import SamplingParams, TokenEvent, request_seed
from blink.transport.layout import ITERATION_TOKEN_BOUNDS
from blink.util.startup import phase

QUEUE_US_MAX = (1 << 32) - 1  # TokenRecord.queue_us saturates
STEP_TIMES_KEPT = 8192  # the last steps' durations, for benchmarks (blink bench barrier)


class HostEngine(Engine):
    def __init__(self, args: EngineArgs, loaded: LoadedModel | None = None, runner=None):
        """runner: ModelRunner.execute's contract; tensor parallelism passes rank 0's TensorParallelRunner
        (blink/parallel/host_tp.py, with `loaded` its shard), which mirrors each step on the other ranks and
        is shut down with this engine. None: a ModelRunner over `loaded` (loaded here when None)."""
        self.args = args
        if runner is None and args.tensor_parallel_size > 1:
            raise ValueError("tensor parallelism needs its runner: build the engine with make_engine()")
        self.m = m = loaded or LoadedModel.load(args)
        self.limits = m.limits
        self.scheduler = Scheduler.from_limits(m.limits, m.eos_token_ids)
        self.tp = runner
        self.runner = runner or ModelRunner.for_model(m, use_graphs=m.device == "cuda" and not args.enforce_eager)
        phase("engine", "forward graphs captured" if getattr(self.runner, "graphs", None) else "runner ready (eager)")
        self._pending: list[TokenEvent] = []  # finish events of aborts, returned by the next step()
        self._arrivals = 0
        self._steps = 0
        self._tokens = 0
        self._iteration_tokens = [0] * (len(ITERATION_TOKEN_BOUNDS) + 1)  # step sizes, for /metrics
        self._iteration_tokens_sum = 0
        self._queue_us: dict[int, int] = {}  # admitted, first token not out yet: the queue time it will carry
        self._step_times: deque[StepTime] = deque(maxlen=STEP_TIMES_KEPT)
        self.constraints = ConstraintLoader(args, m, tensor_parallel=args.tensor_parallel_size > 1)
        self._constrained: dict[int, SamplingParams] = {}  # queued constrained requests: their grammar's refs
        self.pace = DecodePace(args.decode_pace_ms, args.decode_pace_max_batch)

    # -- Engine interface ------------------------------------------------------------------------------
    def add_request(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        if req_id in self.scheduler.requests:
            raise ValueError(f"request id {req_id} is already in use")
        self.m.validate_prompt(prompt_ids, params)
        if params.constraint is not None:  # compiled in a worker process; queued once its tables are here
            self.constraints.park(req_id, prompt_ids, params)
            return
        self._queue(req_id, prompt_ids, params)

    def _queue(self, req_id: int, prompt_ids: list[int], params: SamplingParams, arrived_at: float | None = None):
        """arrived_at: perf_counter at add_request (a constrained request queues after its compile)."""
        self._arrivals += 1
        arrived_at = time.perf_counter() if arrived_at is None else arrived_at
        self.scheduler.add(Sequence(req_id, list(prompt_ids), params, request_seed(params, req_id, self.args.seed),
                                    self._arrivals, arrived_at=arrived_at))
        if params.constraint is not None:
            self._constrained[req_id] = params

    def abort_request(self, req_id: int) -> None:
        event = self.constraints.abort(req_id) or self.scheduler.abort(req_id)
        self._queue_us.pop(req_id, None)
        self._release(req_id)
        if event is not None:
            self._pending.append(event)

    def _release(self, req_id: int) -> None:
        params = self._constrained.pop(req_id, None)
        if params is not None:
            self.constraints.release(params)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.constraints.has_parked() or self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        s = self.scheduler
        pc = s.prefix_cache
        return EngineStats(len(s.running), len(s.waiting), s.blocks.num_free, s.blocks.num_blocks,
                           self._steps, self._tokens, s.num_preemptions, tuple(self._iteration_tokens),
                           self._iteration_tokens_sum, prefix_cache_queries=pc.queries if pc else 0,
                           prefix_cache_hits=pc.hits if pc else 0)

    def publish_model_info(self, ctl) -> None:
        """For the front end's banner (the limits themselves are published by publish_limits)."""
        runner = getattr(self.runner, "runner", self.runner)  # the TP runner wraps rank 0's ModelRunner
        self.m.publish(ctl, captured=bool(getattr(runner, "graphs", None)))

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def step_times(self) -> list[StepTime]:
        """The last STEP_TIMES_KEPT steps that ran, oldest first (one per stats().steps increment)."""
        return list(self._step_times)

    def step(self) -> list[TokenEvent]:
        # The read-back of the sampled tokens already waits for the step: timing it adds no sync.
        start = time.perf_counter()
        queued, failed = self.constraints.ready(idle=not self._pending and not self.scheduler.has_unfinished())
        for req_id, prompt_ids, params, arrived_at in queued:
            self._queue(req_id, prompt_ids, params, arrived_at)
        events, self._pending = self._pending + failed, []
        wait = self.pace.wait_s(start, len(self.scheduler.waiting), self.scheduler.running)
        self.paced = wait > 0
        if self.paced:  # a paced decode step: sleep a slice, and let the caller take arrivals before the next call
            time.sleep(min(wait, PACE_SLICE_S))
            return events
        output = self.scheduler.schedule()
        self.pace.last_start = start
        if not output.chunks:
            return events
        for seq in output.admitted:
            if seq.queue_us < 0:  # the first admission ends the request's queue time
                seq.queue_us = min(max(0, int((start - seq.arrived_at) * 1e6)), QUEUE_US_MAX)
                self._queue_us[seq.req_id] = seq.queue_us
            grammar = self.constraints.slot_grammar(seq.params, seq.output_ids)  # re-admission: walked again
            self.m.sampling_state.set_slot(seq.slot, seq.params, seq.seed, seq.prompt_ids, seq.output_ids, grammar)
        sampled = self.runner.execute(output)
        new = self.scheduler.update_from_output(output, sampled)
        self._steps += 1
        self._tokens += sum(not e.is_prompt for e in new)  # prompt events carry no generated token
        self._iteration_tokens[bisect.bisect_left(ITERATION_TOKEN_BOUNDS, output.num_tokens)] += 1
        self._iteration_tokens_sum += output.num_tokens
        for event in new:
            if event.position == 0 or event.finished:  # the first token carries the queue time
                event.queue_us = self._queue_us.pop(event.req_id, 0) if event.position == 0 else 0
                self._queue_us.pop(event.req_id, None)
            if event.finished:
                self._release(event.req_id)
        self._step_times.append(StepTime(time.perf_counter() - start, output.num_tokens, len(output.chunks)))
        return events + new

    def shutdown(self) -> None:
        self.constraints.shutdown()
        if self.tp is not None:
            self.tp.shutdown()
