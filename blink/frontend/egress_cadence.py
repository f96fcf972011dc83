"""How long the egress reader sleeps between polls while requests are in flight.

Records come in bursts, one a step (each running request's token of that step), and nothing comes between
them. Polling every 100 us through the whole step costs a wake-up each: about 17 us of CPU apiece on the
2-core CI machine, in the kernel (a C loop of nanosleep costs the same), so ~10% of a core spent finding
nothing. The engine cannot ring us: in device mode the GPU writes the records, and nothing on the CPU
is told. So the reader learns the step's rhythm instead: once a burst has been read (a poll that finds
nothing after one that found records), it sleeps through `fraction` of the shortest of the last few
intervals between burst starts, then polls every `poll_s` again until the next burst.

What it risks: a step shorter than `fraction` of that shortest interval has its records read late, by at
most the difference. A longer step costs nothing. Prefill-only steps (no records) merge two intervals,
which the minimum over the history ignores; extra bursts (an abort's record) only shorten the sleeps. A read
that took half the ring or more (`backlog`) may have left the engine waiting for room to write the rest of its
step: the next empty poll does not end that burst.

Bursts are timed when a poll finds them, so one found by the first poll after a long sleep may have come
at any time during it: the steps got shorter, or the reader was starved of CPU. Its start is unknown, so the
reader forgets the rhythm and polls every `poll_s` until it has timed `history` intervals again. Otherwise
one late find would shift every later wake-up by its lateness, and the next bursts would be found late too.
"""
from __future__ import annotations

import collections


class EgressCadence:
    def __init__(self, poll_s: float = 100e-6, fraction: float = 0.75, history: int = 8,
                 max_sleep_s: float = 0.02):
        self.poll_s = poll_s
        self.fraction = fraction
        self.max_sleep_s = max_sleep_s
        self.intervals: collections.deque[float] = collections.deque(maxlen=history)  # a full one: rhythm known
        self.burst_start: float | None = None
        self.in_burst = False
        self.backlog = False
        self.slept_long = False  # the last sleep was the long one: a burst found now came at an unknown time

    def records(self, now: float, backlog: bool = False) -> None:
        """A poll returned records at `now` (perf_counter); `backlog`: half the ring's capacity or more."""
        self.backlog = backlog
        if not self.in_burst:
            if self.slept_long:  # found late, by an unknown time: the steps got shorter, or we were starved
                self.intervals.clear()  # learn the rhythm again, polling every poll_s meanwhile
                self.burst_start = None
            else:
                if self.burst_start is not None:
                    self.intervals.append(now - self.burst_start)
                self.burst_start = now
            self.in_burst = True
        self.slept_long = False

    def empty(self, now: float) -> float:
        """A poll returned nothing at `now`: how long to sleep before the next one."""
        self.slept_long = False
        if not self.in_burst:
            return self.poll_s
        if self.backlog:  # the engine may be waiting for the room we just made: look again soon
            self.backlog = False
            return self.poll_s
        self.in_burst = False
        if self.burst_start is None or len(self.intervals) < self.intervals.maxlen:  # timed late, or rhythm unknown
            return self.poll_s
        sleep = self.burst_start + self.fraction * min(self.intervals) - now
        if sleep <= self.poll_s:
            return self.poll_s
        self.slept_long = True
        return min(self.max_sleep_s, sleep)

    def idle(self) -> None:
        """Nothing in flight: the rhythm is learnt again from the next bursts."""
        self.intervals.clear()
        self.burst_start, self.in_burst, self.backlog, self.slept_long = None, False, False, False
