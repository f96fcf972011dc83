"""The front end's side of the rings: submit and abort requests, route egress events to per-request queues.

Everything that touches the ingress ring runs on the event loop's thread (the ring has one producer).
One daemon thread polls the egress ring (while requests are in flight every 100 us, except through the
part of a step it expects to be silent: egress_cadence.py; idle, with a backoff that a new request cuts
short) and hands batches of events to the loop, which puts each into its request's asyncio.Queue.
While requests are in flight it also times the engine's silences (EgressGaps).
"""
from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from blink.frontend.egress_cadence import EgressCadence
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.rings import EgressConsumer, IngressProducer
from blink.transport.shm import Segment

POLL_TIMEOUT_S = 0.05
FIRST_IDLE_SLEEP_S = 50e-6  # the idle reader's backoff starts here and doubles up to POLL_TIMEOUT_S
ACTIVE_POLL_S = 100e-6  # while requests are in flight: the rings' idle backoff (up to 1 ms) would add to ITL
RETRY_S = 0.001  # how often a full ingress ring is retried
DRAIN_POLL_S = 0.02  # how often the loop looks for the parent's drain_flag (/health reads it directly)
DRAIN_SETTLE_S = 0.1  # after drain_flag: handlers admitted just before it still submit (after their
# tokenization; a stream before its response starts)
REQ_ID_BITS = 63


class EngineUnavailable(Exception):
    """The engine loop is not (or no longer) running."""


class ServerDraining(EngineUnavailable):
    """The server is shutting down: it finishes what it accepted and takes nothing new."""


@dataclass(frozen=True)
class PublishedLimits:
    """The engine's limits as it published them in the control block (blink/core/limits.py)."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_kv_blocks: int
    vocab_size: int
    bucket_tokens: tuple[int, ...]
    prompt_logprob_rows: int = 0  # 0: the engine refuses prompt logprobs


class EgressGaps:
    """The time between consecutive egress reads that returned records, while requests are in flight: how
    long the engine was silent as the front end sees it (a step, or a stall of the engine or the transport).

    Fed by the reader thread, and cheap: one clock read per read that returned records. A read made with
    nothing in flight (the records of aborted requests), and the reader's idle loop, drop the reference, so
    idle time is never counted; the first read after it starts the next gap. The reader needs the GIL and a
    CPU: a front-end stall that holds the GIL (a collection) lengthens a gap too, beside a loop lag
    (blink/util/loop_lag.py); a gap without one is the engine's.
    """

    def __init__(self, on_gap: Callable[[float], None]):
        self.on_gap = on_gap
        self.last: float | None = None

    def read(self, now: float, in_flight: bool) -> None:
        """A read that returned records, at `now` (perf_counter), with requests in flight or not."""
        if in_flight and self.last is not None:
            self.on_gap(now - self.last)
        self.last = now if in_flight else None

    def idle(self) -> None:
        """Nothing in flight."""
        self.last = None


class EngineClient:
    def __init__(self, shm_name: str, heartbeat_timeout_s: float = 10.0,
                 on_egress_gap: Callable[[float], None] | None = None):
        """on_egress_gap(seconds), if given, is called on the reader thread with each EgressGaps gap."""
        self.segment = Segment.attach(shm_name)
        self.control = self.segment.control
        self.producer = IngressProducer(self.segment)
        self.consumer = EgressConsumer(self.segment)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.queues: dict[int, asyncio.Queue[TokenEvent]] = {}
        self.pending: collections.deque = collections.deque()  # ingress writes waiting for room, in order
        self._next_id = random.getrandbits(REQ_ID_BITS - 1)  # random start: ids differ across restarts
        self._last_heartbeat = (int(self.control.heartbeat), time.monotonic())
        self._limits: PublishedLimits | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._writer: asyncio.Task | None = None
        self._drain_watch: asyncio.Task | None = None
        self.egress_gaps = EgressGaps(on_egress_gap) if on_egress_gap is not None else None
        self.ingress_closed = False  # by us, in a drain: nothing more will be submitted
        self.cut_by_shutdown = False  # the engine stopped at the drain timeout: failures read "shutting down"

    # lifecycle (called on the loop)
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = threading.Thread(target=self._read_egress, name="blink-egress", daemon=True)
        self._reader.start()
        self._drain_watch = self._loop.create_task(self._close_ingress_on_drain())

    def close(self) -> None:
        self._stopping.set()
        if self._drain_watch is not None:
            self._drain_watch.cancel()
        if self._reader is not None:
            self._reader.join(timeout=2)
        if self._writer is not None:
            self._writer.cancel()
        self.producer = self.consumer = self.control = None
        self.segment.close()

    def limits(self) -> PublishedLimits:
        """The engine's limits; EngineUnavailable until it has published them (it does so before `ready`)."""
        if self._limits is None:
            ctl = self.control
            if ctl is None or not ctl.ready:
                raise EngineUnavailable("the engine is still starting")
            self._limits = PublishedLimits(
                ctl.max_model_len, ctl.max_num_seqs, ctl.max_num_batched_tokens, ctl.block_size, ctl.num_kv_blocks,
                ctl.vocab_size, tuple(ctl.bucket_tokens[: ctl.num_buckets]), ctl.prompt_logprob_rows)
        return self._limits

    # health
    def engine_alive(self) -> bool:
        ctl = self.control
        if ctl is None or not ctl.ready or ctl.exited:
            return False
        heartbeat, seen_at = self._last_heartbeat
        now = time.monotonic()
        if int(ctl.heartbeat) != heartbeat:
            self._last_heartbeat = (int(ctl.heartbeat), now)
            return True
        return now - seen_at < self.heartbeat_timeout_s

    # drain
    @property
    def draining(self) -> bool:
        ctl = self.control
        return ctl is not None and bool(ctl.drain_flag)

    async def _close_ingress_on_drain(self) -> None:
        """Once the parent raises drain_flag (new HTTP requests are refused from then on: serving.py),
        let the requests admitted before it submit, send the ones queued for ring room, then raise
        ingress_closed so the engine exits once all is served."""
        while not self.draining:
            await asyncio.sleep(DRAIN_POLL_S)
        await asyncio.sleep(DRAIN_SETTLE_S)
        while self.pending:
            await asyncio.sleep(RETRY_S)
        self.ingress_closed = True
        self.control.ingress_closed = 1  # after the last descriptor's tail store (x86-64 store order)

    # requests (called on the loop)
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> tuple[int, asyncio.Queue]:
        """Register and send a request. Raises ValueError for one the ring cannot carry."""
        if self.ingress_closed:
            raise ServerDraining("server shutting down")
        if not self.engine_alive():
            raise EngineUnavailable("the engine is not running")
        req_id = self._new_id()
        sent = not self.pending and self.producer.submit(req_id, prompt_ids, params, timeout=0)
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.queues[req_id] = queue
        self._wake.set()  # the reader leaves its idle backoff for the active poll
        if not sent:
            self._defer(("request", req_id, prompt_ids, params))
        return req_id, queue

    def abort(self, req_id: int) -> None:
        """Stop a request we no longer want; its later events are dropped. Never blocks."""
        if self.queues.pop(req_id, None) is None:
            return  # already finished
        for item in self.pending:
            if item[0] == "request" and item[1] == req_id:
                self.pending.remove(item)  # never sent: nothing to abort on the engine
                return
        if self.pending or not self.producer.abort(req_id, timeout=0):
            self._defer(("abort", req_id))

    def _new_id(self) -> int:
        self._next_id = (self._next_id + 1) % (1 << REQ_ID_BITS)
        return self._next_id

    def _defer(self, item: tuple) -> None:
        self.pending.append(item)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_pending())

    async def _write_pending(self) -> None:
        while self.pending:
            item = self.pending[0]
            if item[0] == "request":
                try:
                    sent = self.producer.submit(item[1], item[2], item[3], timeout=0)
                except ValueError:  # cannot be sent at all: the request ends with an error
                    self._dispatch([TokenEvent(item[1], -1, -1, FinishReason.ERROR)])
                    sent = True
            else:
                sent = self.producer.abort(item[1], timeout=0)
            if sent:
                self.pending.popleft()
            else:
                await asyncio.sleep(RETRY_S)

    # egress (reader thread -> loop)
    def _read_egress(self) -> None:
        idle_sleep = FIRST_IDLE_SLEEP_S
        gaps, cadence = self.egress_gaps, EgressCadence(ACTIVE_POLL_S)
        while not self._stopping.is_set():
            events = self.consumer.poll()
            if events:
                idle_sleep = FIRST_IDLE_SLEEP_S
                now = time.perf_counter()
                cadence.records(now, backlog=2 * len(events) >= self.consumer.ring.capacity)
                if gaps is not None:
                    gaps.read(now, bool(self.queues))
                self._loop.call_soon_threadsafe(self._dispatch, events)
            elif self.control.exited:
                late = self.consumer.poll()  # records published just before `exited` (a drain's last ones)
                if late:
                    self._loop.call_soon_threadsafe(self._dispatch, late)
                    continue
                self._loop.call_soon_threadsafe(self._fail_all)
                self._stopping.wait(POLL_TIMEOUT_S)
            elif self.queues:  # truthiness of a dict is atomic; a stale answer only changes the backoff
                time.sleep(cadence.empty(time.perf_counter()))
            else:  # idle: back off, but a new request wakes us at once (its first token must not wait a sleep out)
                cadence.idle()
                if gaps is not None:
                    gaps.idle()
                self._wake.wait(idle_sleep)
                self._wake.clear()
                idle_sleep = min(2 * idle_sleep, POLL_TIMEOUT_S)

    def _dispatch(self, events: list[TokenEvent]) -> None:
        for event in events:
            queue = self.queues.get(event.req_id)
            if queue is None:
                continue  # aborted by us, or finished
            queue.put_nowait(event)
            if event.finished:
                del self.queues[event.req_id]

    def _fail_all(self) -> None:
        if self.queues:
            self.cut_by_shutdown = self.draining
        for req_id, queue in list(self.queues.items()):
            queue.put_nowait(TokenEvent(req_id, -1, -1, FinishReason.ERROR))
        self.queues.clear()
