"""Graceful drain of `blink serve`, run by the parent after SIGTERM/SIGINT.

The protocol is three words of the control block, so it needs no CPU per step in device mode:
1. the parent raises `drain_flag`: the front end answers /health and new requests with 503 at once;
2. the front end sends what it had already accepted (requests waiting for ring room included), then
   raises `ingress_closed`;
3. the engine (GPU scheduler or host loop) serves everything in the ring, waiting or running, and exits
   by itself on an idle turn once ingress is closed and empty: the drain is over.
At `timeout` seconds, or on a second signal, the parent raises `stop_flag`: the engine exits after its
step and the front end ends the requests left with a "server shutting down" error (503).
"""
from __future__ import annotations

import sys
import time

from blink.util.processes import StopSignals

POLL_S = 0.05
CUT_WAIT_S = 8.0  # after stop_flag, for the engine's step to end (the parent escalates after that)


class StopRequest(StopSignals):
    """Set by the SIGTERM/SIGINT handler; `live` once the server was ready (a stop then drains instead of
    cutting)."""

    def __init__(self):
        super().__init__(poll_s=POLL_S)
        self.live = False


def _say(message: str) -> None:
    print(f"blink serve: {message}", file=sys.stderr, flush=True)


def drain(segment, engine, frontend, timeout: float, stop: StopRequest) -> bool:
    """Drain the server (see the module doc); True if everything accepted finished in time. `engine` and
    `frontend` are the children (None: nothing to drain)."""
    ctl = segment.control
    if ctl is None or engine is None or frontend is None:
        return False
    signals_at_start = stop.signals
    ctl.drain_flag = 1
    _say(f"draining: new requests are refused; in-flight ones get up to {timeout:g} s")
    start = time.monotonic()
    deadline = start + timeout
    while not ctl.exited and engine.exit_code() is None:
        if time.monotonic() >= deadline or stop.signals > signals_at_start or frontend.exit_code() is not None:
            left = int(ctl.running) + int(ctl.waiting)
            _say(f"drain cut after {time.monotonic() - start:.1f} s: {left} requests end with "
                 "'server shutting down'")
            ctl.stop_flag = 1
            # The front end goes only after the engine has exited: it then ends the streams left with
            # the error event instead of having uvicorn close their connections.
            cut = time.monotonic() + CUT_WAIT_S
            while not ctl.exited and engine.exit_code() is None and time.monotonic() < cut:
                time.sleep(POLL_S)
            return False
        time.sleep(POLL_S)
    _say(f"drained in {time.monotonic() - start:.1f} s")
    return True
