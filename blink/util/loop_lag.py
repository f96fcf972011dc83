"""How long an asyncio event loop could not run anything: a timer that asks to wake every tick, and how late
each wake-up comes.

Every stream of the front end is served by one event loop, so a callback that holds it (a long JSON encode,
a blocking call, a collection holding the GIL) delays every stream at once, as a whole-server pause does.
The interference lab finds such pauses from the client side (blink/bench/pauses.py); this timer's lateness
tells whether the front end's loop was blocked through one, or whether the engine fell silent instead
(EngineClient's egress gaps). A late wake-up measures at least the block less one tick.

The tick is 20 ms while `busy()` (requests in flight) and 250 ms otherwise: pauses of interest are over 50 ms,
and a 5 ms tick cost about 0.02 of a core on the 2-core CPU machine, idle servers included.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

TICK_S = 0.02
IDLE_TICK_S = 0.25


class LoopLagMonitor:
    """Calls on_lag(seconds late) after every tick of the running loop, from start() until stop()."""

    def __init__(self, on_lag: Callable[[float], None], tick_s: float = TICK_S, idle_tick_s: float = IDLE_TICK_S,
                 busy: Callable[[], bool] = lambda: True):
        self.on_lag = on_lag
        self.tick_s, self.idle_tick_s, self.busy = tick_s, idle_tick_s, busy
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
        loop = asyncio.get_running_loop()
        while True:
            tick = self.tick_s if self.busy() else self.idle_tick_s
            expected = loop.time() + tick
            await asyncio.sleep(tick)
            # the loop may wake up to its clock resolution early: that is no lag
            self.on_lag(max(0.0, loop.time() - expected))
