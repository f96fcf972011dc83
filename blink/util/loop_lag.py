"""How long an asyncio event loop could not run anything: a timer that asks to wake every 5 ms, and how late
each wake-up comes.

Every stream of the front end is served by one event loop, so a callback that holds it (a long JSON encode,
a blocking call, a collection holding the GIL) delays every stream at once, as a whole-server pause does.
The interference lab finds such pauses from the client side (blink/bench/pauses.py); this timer's lateness
tells whether the front end's loop was blocked through one, or whether the engine fell silent instead
(EngineClient's egress gaps). A late wake-up measures at least the block less one tick.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

TICK_S = 0.005


class LoopLagMonitor:
    """Calls on_lag(seconds late) after every tick of the running loop, from start() until stop()."""

    def __init__(self, on_lag: Callable[[float], None], tick_s: float = TICK_S):
        self.on_lag = on_lag
        self.tick_s = tick_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Called on the loop to watch."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="blink-loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop, tick = asyncio.get_running_loop(), self.tick_s
        while True:
            expected = loop.time() + tick
            await asyncio.sleep(tick)
            # the loop may wake up to its clock resolution early: that is no lag
            self.on_lag(max(0.0, loop.time() - expected))
