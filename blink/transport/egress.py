"""The egress ring: one TokenRecord per generated token (and per finish) from the engine to the front end.
The protocol is blink/transport/ring.py's."""
from __future__ import annotations

import time

import numpy as np

from blink.request import MAX_TOP_LOGPROBS, TokenEvent
from blink.transport.grammar_staging import GrammarStaging
from blink.transport.ring import (
    FINISH_REASONS,
    HEAD_INDEX,
    TAIL_INDEX,
    TOKEN_DTYPE,
    _checked,
    _remaining,
    _Ring,
    wait_for,
)
from blink.transport.shm import Segment


def _egress_ring(seg: Segment) -> _Ring:
    layout = seg.layout
    records = seg.array(TOKEN_DTYPE, layout.egress_capacity, layout.egress_records)
    return _Ring(seg, layout.egress_header, records)


class EgressProducer:
    """Engine side of the egress ring (host mode): token records, in order, blocking while full."""

    def __init__(self, seg: Segment):
        self.ring = _egress_ring(seg)

    def push(self, events: list[TokenEvent], timeout: float | None = None) -> int:
        """Write `events` in order; returns how many went in (all, unless `timeout` ran out first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pushed = 0
        while pushed < len(events):
            if not wait_for(lambda: self.ring.free() > 0, _remaining(deadline)):
                break
            chunk = events[pushed:pushed + self.ring.free()]
            tail = self.ring.tail
            self.ring.write(tail, _encode_events(chunk))
            self.ring.words[TAIL_INDEX] = tail + len(chunk)  # after the payload: this store publishes it
            pushed += len(chunk)
        return pushed


def _encode_events(events: list[TokenEvent]) -> np.ndarray:
    records = np.zeros(len(events), TOKEN_DTYPE)
    names = ("req_id", "token_id", "position", "finish_reason", "logprob", "queue_us", "cached_tokens")
    rows = [(e.req_id, e.token_id, e.position, int(e.finish_reason), e.logprob,
             e.rank if e.is_prompt else e.queue_us, e.cached_tokens) for e in events]  # layout.py: prompt records
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        records[name] = _checked(column, TOKEN_DTYPE[name], name)
    for i, event in enumerate(events):
        if num_top := len(event.top_ids):
            if num_top > MAX_TOP_LOGPROBS or len(event.top_logprobs) != num_top:
                raise ValueError(f"an event carries 0..{MAX_TOP_LOGPROBS} top_ids with as many top_logprobs")
            records["num_top"][i] = num_top
            records["top_ids"][i, :num_top] = event.top_ids
            records["top_logprobs"][i, :num_top] = event.top_logprobs
    return records


class EgressConsumer:
    """Front-end side of the egress ring."""

    def __init__(self, seg: Segment):
        self.ring = _egress_ring(seg)
        self.staging = GrammarStaging.of(seg)  # a request's last record frees its grammar staging slot

    def poll(self, max_items: int = 1 << 30) -> list[TokenEvent]:
        """Take up to `max_items` events without waiting (possibly none)."""
        head = self.ring.head
        count = min(self.ring.tail - head, max_items)
        if count <= 0:
            return []
        records = self.ring.read(head, count)
        self.ring.words[HEAD_INDEX] = head + count  # after the copy: the producer may now reuse the slots
        # Column-wise tolist() is far cheaper than touching each record's fields from Python.
        events = [
            TokenEvent(req_id, token_id, position, FINISH_REASONS[finish], logprob, queue_us=queue_us,
                       cached_tokens=cached)
            for req_id, token_id, position, finish, logprob, queue_us, cached in zip(
                records["req_id"].tolist(), records["token_id"].tolist(), records["position"].tolist(),
                records["finish_reason"].tolist(), records["logprob"].tolist(), records["queue_us"].tolist(),
                records["cached_tokens"].tolist(), strict=True)
        ]
        prompt = (records["position"] < 0) & (records["finish_reason"] == 0)  # prompt records (layout.py)
        for i in np.flatnonzero(prompt).tolist():  # their rank travels in queue_us
            events[i].rank, events[i].queue_us = events[i].queue_us, 0
        for i, num_top in enumerate(records["num_top"].tolist()):
            if num_top:
                events[i].top_ids = records["top_ids"][i, :num_top].tolist()
                events[i].top_logprobs = records["top_logprobs"][i, :num_top].tolist()
        if self.staging is not None:
            for event in events:
                if event.finish_reason:
                    self.staging.finished(event.req_id)
        return events

    def wait(self, timeout: float | None, max_items: int = 1 << 30) -> list[TokenEvent]:
        """Like poll, but first waits (backing off) up to `timeout` seconds for at least one event."""
        wait_for(lambda: self.ring.used() > 0, timeout)
        return self.poll(max_items)
