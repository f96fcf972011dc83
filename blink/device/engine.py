"""Device mode behind the Engine interface: the GPU runs the loop, this object only talks to the rings.

In process (`blink generate --engine device`, the offline LLM, tests): `DeviceEngine` creates its own
segment, submits through IngressProducer and drains EgressConsumer in `step()`. As the engine process of
`blink serve --engine device`: `serve_device(segment_name, args)` attaches the front end's segment,
provisions, lets the GPU serve the rings, and sleeps until stop_flag.

While a DeviceEngine lives, its scheduler kernel is resident: a device-wide synchronize in the same process
(torch.cuda.synchronize(), empty_cache(), freeing a CUDA graph or pool) waits for it forever. Synchronize
torch's stream instead (torch.cuda.current_stream().synchronize()), or shut the engine down first;
PollWatchdog prints the stalled stack if it happens.
"""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable

import numpy as np

from blink.config import EngineArgs
from blink.core.interface import Engine, EngineStats, StepTime
from blink.core.loaded_model import LoadedModel
from blink.device import structs
from blink.device.constraints import DeviceConstraints
from blink.device.poll_watchdog import PollWatchdog
from blink.device.runtime import DeviceLoop
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.commands import request_prefix_cache_reset
from blink.transport.layout import SegmentLayout, grammar_staging
from blink.transport.rings import EgressConsumer, IngressProducer
from blink.transport.shm import Segment

POLL_WAIT_S = 0.05  # step() waits this long for the GPU's next record before returning empty
STOP_POLL_S = 0.05
SUBMIT_WAIT_S = 0.01
RESET_TIMEOUT_S = 10.0  # the GPU applies a prefix-cache reset between steps
IDLE_GAP_NS = 200_000  # a finish-to-ingest phase this long means the loop idled between two steps
_segment_ids = itertools.count()


def default_layout(loaded: LoadedModel, grammar_arena_bytes: int = 0) -> SegmentLayout:
    return SegmentLayout(1024, max(1 << 20, 4 * loaded.max_model_len), 1 << 14, *grammar_staging(grammar_arena_bytes))


class DeviceEngine(Engine):
    def __init__(self, args: EngineArgs, loaded: LoadedModel | None = None, tp=None, **loop_kwargs):
        """tp: rank 0's DeviceTensorParallel (blink/parallel/device_tp.py, with `loaded` its shard) under
        --tensor-parallel-size > 1; make_engine() builds both. This engine stops or kills it at shutdown."""
        self.args = args
        self.loop = None
        self.tp = tp
        self.m = rank0_model(args, loaded, tp)
        self.limits = self.m.limits
        name = f"blink-device-{os.getpid()}-{next(_segment_ids)}"
        self.segment = Segment.create(name, default_layout(self.m, args.grammar_arena_mb << 20))
        self.producer = IngressProducer(self.segment, base_seed=args.seed)
        self.consumer = EgressConsumer(self.segment)
        self.live: set[int] = set()
        self._pending: list[TokenEvent] = []  # drained while add_request waited for ingress room
        self.watchdog = None
        self.constraints = DeviceConstraints(args, self.m, self.segment)
        try:
            self.loop = DeviceLoop(self.m, args, self.segment, peers=self.tp.peers if self.tp else None,
                                   **loop_kwargs)
            self.loop.start()
            self.loop.wait_ready()
        except BaseException:
            self.shutdown()
            raise
        # From here on a device-wide synchronize on the caller's thread hangs behind the resident loop.
        self.watchdog = PollWatchdog(lambda: bool(self.live), self._describe).start()

    # -- Engine interface ---------------------------------------------------------------------------------
    def add_request(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        if req_id in self.live:
            raise ValueError(f"request id {req_id} is already in use")
        self.m.validate_prompt(prompt_ids, params)
        self.watchdog.poked()
        c = params.constraint
        if c is not None:  # compiled here, per request; staged for the GPU's admission copy
            try:
                tables = self.constraints.tables(c)
            except ValueError:  # refused, as in host mode: the request ends with ERROR
                self.live.add(req_id)
                self._pending.append(TokenEvent(req_id, -1, 0, FinishReason.ERROR))
                return
            self.constraints.reserve(c, tables, self._drain_a_little)
        try:
            # While the ingress ring is full, keep draining egress: a GPU blocked on a full egress ring
            # stops reading ingress, and waiting on it alone would deadlock.
            while not self.producer.submit(req_id, list(prompt_ids), params, timeout=SUBMIT_WAIT_S):
                self._drain_a_little()
        finally:
            if c is not None:
                self.constraints.unreserve(c)
        self.live.add(req_id)

    def abort_request(self, req_id: int) -> None:
        self.watchdog.poked()
        if req_id in self.live:  # the GPU answers with the ABORT record
            while not self.producer.abort(req_id, timeout=SUBMIT_WAIT_S):
                self._check_alive()
                self._pending += self.consumer.poll()

    def step(self) -> list[TokenEvent]:
        self.watchdog.poked()
        events, self._pending = self._pending, []
        events += self.consumer.wait(0 if events or not self.live else POLL_WAIT_S)
        for ev in events:
            if ev.finished:
                self.live.discard(ev.req_id)
        if not events and self.live:
            self._check_alive()
        return events

    def has_unfinished(self) -> bool:
        return bool(self.live or self._pending)

    def stats(self) -> EngineStats:
        c = self.segment.control
        return EngineStats(c.running, c.waiting, c.free_kv_blocks, c.total_kv_blocks, c.steps, c.tokens,
                           c.preemptions, tuple(c.iteration_tokens), c.iteration_tokens_sum,
                           prefix_cache_queries=c.prefix_cache_queries, prefix_cache_hits=c.prefix_cache_hits)

    def reset_prefix_cache(self) -> bool:
        """The GPU loop applies the command word between steps (csrc/sched.h); wait until it has."""
        return request_prefix_cache_reset(self.segment.control, RESET_TIMEOUT_S) and self.limits.enable_prefix_caching

    def step_times(self) -> list[StepTime]:
        """Launch-to-launch time of back-to-back forwards (the loop's %globaltimer trace), oldest first.
        A period in which the loop went idle (waiting for requests) is not a step and is left out, as is
        the newest launch until the next one starts."""
        return step_times_from_trace(self.loop.trace_snapshot())

    def shutdown(self) -> None:
        if getattr(self, "watchdog", None) is not None:
            self.watchdog.stop()
            self.watchdog = None
        if getattr(self, "constraints", None) is not None:
            self.constraints.shutdown()
        stopped = True
        if getattr(self, "loop", None) is not None:
            try:
                self.loop.stop()  # the loop posts stop to the follower ranks as it exits
            except BaseException:
                stopped = False
                raise
            finally:
                self.loop.close()
                self.loop = None
                if self.tp is not None:
                    self.tp.close() if stopped else self.tp.kill()
                    self.tp = None
        elif getattr(self, "tp", None) is not None:
            self.tp.kill()  # the loop never started: the followers wait for a stop that will not come
            self.tp = None
        self._release_segment()

    # -- helpers -------------------------------------------------------------------------------------------
    def _drain_a_little(self) -> bool:
        """Wait for ring room or a free grammar slot: read egress meanwhile. False if nothing is in flight."""
        self._check_alive()
        self._pending += self.consumer.wait(SUBMIT_WAIT_S)
        self.watchdog.poked()
        return bool(self.live)

    def _check_alive(self) -> None:
        if not self.loop.alive():
            raise RuntimeError(f"the device loop has stopped: {self.loop.error()}")
        check_followers(self.tp)

    def _describe(self) -> str:
        """Live counters from the shared segment only (no CUDA call: it could block behind the stall)."""
        seg = self.segment
        return "no segment" if seg is None else f"{seg.counters()}; {len(self.live)} requests live"

    def _release_segment(self) -> None:
        if self.segment is not None:
            self.producer = self.consumer = None
            self.segment.close()
            self.segment.unlink()
            self.segment = None


def rank0_model(args: EngineArgs, loaded: LoadedModel | None, tp) -> LoadedModel:
    """This process's model: under tensor parallelism the shard that `tp` loaded, else `loaded` or a fresh load."""
    if args.tensor_parallel_size == 1:
        return loaded or LoadedModel.load(args)
    if tp is None:
        raise ValueError("tensor parallelism needs its ranks: build the engine with make_engine()")
    return tp.loaded


def step_times_from_trace(t: np.ndarray) -> list[StepTime]:
    """[launches, TRACE_WORDS] (structs.TRACE_PHASES) -> one StepTime per launch that the next launch
    followed back to back: launch-to-launch seconds, with that step's tokens and rows."""
    tokens, rows = structs.trace_step_sizes(t)
    periods = np.diff(t[:, 0]) / 1e9
    # Step i finished ([3]) -> step i+1 read the ring ([4]): microseconds, unless the loop idled.
    busy = (t[1:, 4] - t[:-1, 3]) < IDLE_GAP_NS
    return [StepTime(float(periods[i]), int(tokens[i]), int(rows[i])) for i in range(len(periods)) if busy[i]]


def check_followers(tp) -> None:
    """Under device-mode TP: a follower rank that died leaves every GPU waiting inside a collective, which
    the step timeout would report only after minutes; say so now (the process has to exit: the stuck
    GPU work cannot be freed)."""
    dead = tp.dead() if tp is not None else None
    if dead is not None:
        raise RuntimeError(f"{dead}; the other GPUs are stuck in a collective, so the engine has to restart")


def drained(ctl) -> bool:
    """The loop exited because the drain was over (ingress closed, all served), not on a fatal error."""
    code = int(ctl.error_code)
    return bool(ctl.ingress_closed) and code != structs.ERR_STEP_TIMEOUT and code < structs.ERR_TAIL_LAUNCH_BASE


def serve_device(segment: Segment | str, args: EngineArgs, loaded: LoadedModel | None = None, tp=None,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
    """The engine process in serve mode: provision, hand the rings to the GPU, sleep until stop_flag (or
    should_stop(), or the GPU loop's own exit at the end of a drain), then stop the loop and free.
    `segment` is the front end's (attached or by name); `tp` as for DeviceEngine (stopped or killed here)."""
    own = isinstance(segment, str)
    seg = Segment.attach(segment) if own else segment
    loop = None
    try:
        loaded = rank0_model(args, loaded, tp)
        loop = DeviceLoop(loaded, args, seg, peers=tp.peers if tp else None)
        loaded.publish(seg.control, captured=True)  # before the loop sets `ready`
        loop.start()
        loop.wait_ready()
        ctl = seg.control
        while not ctl.stop_flag and not should_stop():
            if ctl.exited:
                if drained(ctl):
                    break  # the GPU finished what the front end sent after it closed ingress
                raise RuntimeError(f"the device loop stopped on its own: {loop.error()}")
            check_followers(tp)
            time.sleep(STOP_POLL_S)
        loop.stop()
    finally:
        if loop is not None:
            loop.close()
        if tp is not None:  # after a clean stop the followers exit on their own; else they must be killed
            tp.close() if loop is not None and not loop.running else tp.kill()
        seg.control.exited = 1
        if own:
            seg.close()
