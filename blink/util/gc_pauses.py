"""Python's garbage collector in the serving processes: freeze the startup heap once, and time every collection.

A full (generation 2) collection walks every tracked object of the process while holding the GIL. In the
front end, the only per-token CPU work of device mode, that stops every stream at once: the interference
lab's isolated device-mode points showed whole-server pauses of 140-196 ms with every stream waiting
(docs/perf.md, 2026-12-01 session 9), the size SGLang traced to gen-2 collections over a large heap
(sgl-project/sglang#9241). Almost everything a process holds once it serves (imports, the tokenizer, the
app, the model's Python objects) lives until exit, so `freeze_heap` moves it out of every later collection
(gc.freeze); what requests allocate afterwards is still collected. `GcPauses` reports each collection's
length, so /metrics shows what is left. On the H200 (session 10) no full collection ran inside those 15 s
points with or without the freeze, so it was not their cause; where full collections do run (32 req/s) the
freeze keeps them at 5-13 ms in the isolated points.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable


def freeze_heap() -> int:
    """Collect once, then freeze what survives (per process, at startup); returns the frozen object count."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_heap() -> None:
    """Give the frozen objects back to the collector (at shutdown: a process that serves again, as tests do,
    must not keep what died meanwhile out of its collections)."""
    gc.unfreeze()


class GcPauses:
    """Calls on_pause(generation, seconds) after every collection of this process, until close()."""

    def __init__(self, on_pause: Callable[[int, float], None]):
        self.on_pause = on_pause
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.on_pause(int(info["generation"]), time.perf_counter() - self._started)
            self._started = 0.0

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
