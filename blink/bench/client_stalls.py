"""The load generator's own stalls during a run: its event loop's late wake-ups and its garbage collections,
each with its time, so that a whole-server pause (blink/bench/pauses.py) can be checked against them.

The client measures every token's arrival on one event loop. If that loop is held (a collection, the
client's cores taken), every stream's next token is stamped late at once, which reads exactly like a pause
of the server. The server's own records (server_stalls.py: loop lag, egress gaps, the engine's step
intervals) clear the server; these clear, or convict, the client.
"""
from __future__ import annotations

import contextlib
import gc
import time

from blink.util.loop_lag import LoopLagMonitor

TICK_S = 0.01  # the client runs on cores of its own: a finer tick than the front end's costs nothing there
MIN_LAG_S = 0.02  # late wake-ups shorter than this are not kept (a step is 5-15 ms; a pause is over 60)
MIN_GENERATION = 1  # young collections take microseconds


class ClientStallRecorder:
    """Records (perf_counter end, seconds) of each loop lag over MIN_LAG_S and (perf_counter start, generation,
    seconds) of each collection of MIN_GENERATION or older, from start() (on the loop) until stop(). With the
    collector held only an explicit gc.collect() is recorded."""

    def __init__(self, min_lag_s: float = MIN_LAG_S, tick_s: float = TICK_S, collector_held: bool = False):
        self.min_lag_s = min_lag_s
        self.collector_held = collector_held  # the run held the collector (collector_held): said in the record
        self.loop_lags: list[tuple[float, float]] = []
        self.gcs: list[tuple[float, int, float]] = []
        self._monitor = LoopLagMonitor(self._on_lag, tick_s=tick_s, idle_tick_s=tick_s)
        self._gc_started = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._monitor.start()

    async def stop(self) -> None:
        await self._monitor.stop()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_lag(self, lag_s: float) -> None:
        if lag_s >= self.min_lag_s:
            self.loop_lags.append((time.perf_counter(), lag_s))

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif info.get("generation", 0) >= MIN_GENERATION:
            self.gcs.append((self._gc_started, info["generation"], time.perf_counter() - self._gc_started))

    def relative_to(self, first_send: float) -> dict:
        """{"loop_lags": [[start s, seconds]], "gcs": [[start s, generation, seconds]]} on the clock of the
        requests' send times (seconds from the first send, as result_folder.raw_requests), microseconds."""
        us = lambda x: round(x, 6)
        return {"loop_lags": [[us(end - lag - first_send), us(lag)] for end, lag in self.loop_lags],
                "gcs": [[us(start - first_send), gen, us(seconds)] for start, gen, seconds in self.gcs],
                "collector_held": self.collector_held}


@contextlib.contextmanager
def collector_held():
    """No collection inside the block: the heap so far frozen (gc.freeze: no later collection walks it), the
    collector off until the block ends. The interference lab's points 2026-12-02..04 had four full collections of
    the load generator (260-634 ms each, its long-lived heap walked): each made a whole-server pause of the same
    start and length (docs/results.md). Young garbage left over the block is freed by the collections after it."""
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def stalls_in(stalls: dict | None, start_s: float, length_s: float) -> list[str]:
    """The client's stalls that overlap [start_s, start_s + length_s]: "lag 230 ms", "gc2 12 ms"."""
    if not stalls:
        return []
    end = start_s + length_s
    found = [f"lag {lag * 1000:.0f} ms" for t, lag in stalls.get("loop_lags", ()) if t < end and t + lag > start_s]
    found += [f"gc{gen} {s * 1000:.0f} ms" for t, gen, s in stalls.get("gcs", ()) if t < end and t + s > start_s]
    return found
