"""Host mode: the conventional architecture. A Python scheduler on the CPU decides every step and
replays the forward graphs from the host (what vLLM and SGLang do); on a machine without a GPU it runs
the model eagerly with the torch reference kernels."""
from __future__ import annotations

import time
from collections import deque

from blink.config import EngineArgs
from blink.core.interface import Engine, EngineStats, StepTime
from blink.core.loaded_model import LoadedModel
from blink.core.runner import ModelRunner
from blink.core.scheduler import Scheduler
from blink.core.sequence import Sequence
from blink.request import SamplingParams, TokenEvent, request_seed

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
        self._pending: list[TokenEvent] = []  # finish events of aborts, returned by the next step()
        self._arrivals = 0
        self._steps = 0
        self._tokens = 0
        self._step_times: deque[StepTime] = deque(maxlen=STEP_TIMES_KEPT)

    # -- Engine interface ------------------------------------------------------------------------------
    def add_request(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        if req_id in self.scheduler.requests:
            raise ValueError(f"request id {req_id} is already in use")
        self.m.validate_prompt(prompt_ids, params)
        self._arrivals += 1
        self.scheduler.add(Sequence(req_id, list(prompt_ids), params, request_seed(params, req_id, self.args.seed),
                                    self._arrivals))

    def abort_request(self, req_id: int) -> None:
        event = self.scheduler.abort(req_id)
        if event is not None:
            self._pending.append(event)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        s = self.scheduler
        pc = s.prefix_cache
        return EngineStats(len(s.running), len(s.waiting), s.blocks.num_free, s.blocks.num_blocks,
                           self._steps, self._tokens, s.num_preemptions, pc.queries if pc else 0, pc.hits if pc else 0)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def step_times(self) -> list[StepTime]:
        """The last STEP_TIMES_KEPT steps that ran, oldest first (one per stats().steps increment)."""
        return list(self._step_times)

    def step(self) -> list[TokenEvent]:
        # The read-back of the sampled tokens already waits for the step: timing it adds no sync.
        start = time.perf_counter()
        events, self._pending = self._pending, []
        output = self.scheduler.schedule()
        if not output.chunks:
            return events
        for seq in output.admitted:
            self.m.sampling_state.set_slot(seq.slot, seq.params, seq.seed, seq.prompt_ids, seq.output_ids)
        sampled = self.runner.execute(output)
        new = self.scheduler.update_from_output(output, sampled)
        self._steps += 1
        self._tokens += len(new)
        self._step_times.append(StepTime(time.perf_counter() - start, output.num_tokens, len(output.chunks)))
        return events + new

    def shutdown(self) -> None:
        if self.tp is not None:
            self.tp.shutdown()
