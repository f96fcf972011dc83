"""A ring over a `Segment`'s section, and the protocol both rings share: single producer / single consumer, never lossy.

Counters are 64-bit and only grow; the slot of counter c is c % capacity. The producer owns `tail`, the
consumer owns `head`; a full ring means the producer waits (backpressure), nothing is ever overwritten.

Ordering: the producer writes the payload, then stores the tail; the consumer loads the tail, then reads
the payload, then stores the head. Every store and load below is its own numpy call (an opaque C call,
so the compiler cannot move one across another), counters are aligned 8-byte words (single-copy atomic)
and x86-64 keeps store->store and load->load order, which gives release/acquire for these plain accesses.
The GPU side of the same protocol must use st.release.sys / ld.acquire.sys (see csrc/layout.h).
All state lives in the segment, so either side may be a different process, a new object, or the GPU.
Each side is single-threaded by contract: one producer and one consumer object per ring, whose calls
never overlap (an asyncio front end should submit with timeout=0 and retry, not block its loop).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from blink.request import FinishReason
from blink.transport.layout import RequestDescriptor, TokenRecord
from blink.transport.shm import HEAD_INDEX, TAIL_INDEX, Segment  # noqa: F401 (HEAD/TAIL re-exported)

DESCRIPTOR_DTYPE = np.dtype(RequestDescriptor)
TOKEN_DTYPE = np.dtype(TokenRecord)
SPIN_S = 50e-6  # busy-poll this long before sleeping: catches a reply that is already on its way
FIRST_SLEEP_S = 20e-6
MAX_SLEEP_S = 1e-3  # the idle cost is then ~1k wake-ups/s, far from a busy core
FINISH_REASONS = {int(reason): reason for reason in FinishReason}  # FinishReason(x) is slow per token


def wait_for(ready: Callable[[], bool], timeout: float | None) -> bool:
    """Poll `ready` until it is true (True) or `timeout` seconds pass (False); None waits forever.

    Spins ~50 us, then sleeps 20 us doubling to 1 ms, so a waiting reader never burns a core.
    """
    if ready():
        return True
    if timeout is not None and timeout <= 0:
        return False
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    sleep = FIRST_SLEEP_S
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return ready()
        if now - start >= SPIN_S:
            time.sleep(sleep if deadline is None else min(sleep, deadline - now))
            sleep = min(sleep * 2, MAX_SLEEP_S)
        if ready():
            return True


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


class _Ring:
    """One ring's header words and record array, seen from either side."""

    def __init__(self, seg: Segment, header_offset: int, records: np.ndarray):
        self.words = seg.ring_header(header_offset)
        self.records = records
        self.capacity = len(records)

    @property
    def tail(self) -> int:
        return int(self.words[TAIL_INDEX])

    @property
    def head(self) -> int:
        return int(self.words[HEAD_INDEX])

    def free(self) -> int:
        return self.capacity - (self.tail - self.head)

    def used(self) -> int:
        return self.tail - self.head

    def write(self, counter: int, items: np.ndarray) -> None:
        """Copy `items` into the slots starting at `counter`, wrapping at the end of the array."""
        start = counter % self.capacity
        first = min(len(items), self.capacity - start)
        self.records[start:start + first] = items[:first]
        self.records[:len(items) - first] = items[first:]

    def read(self, counter: int, count: int) -> np.ndarray:
        """A private copy of `count` slots starting at `counter`, unwrapped."""
        start = counter % self.capacity
        first = min(count, self.capacity - start)
        if first == count:
            return self.records[start:start + count].copy()
        return np.concatenate([self.records[start:], self.records[:count - first]])


def _checked(values, dtype, what: str) -> np.ndarray:
    """`values` as an array of `dtype`, or ValueError naming `what` when one does not fit."""
    try:
        return np.asarray(values, dtype=dtype)
    except (OverflowError, TypeError, ValueError) as e:
        raise ValueError(f"{what} out of range for {np.dtype(dtype)}: {e}") from None
