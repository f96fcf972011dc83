"""Process lifetime: dying with the parent (no orphan engine, rank or attacker if the process that started it is
killed outright), and stop signals a loop polls."""
from __future__ import annotations

import ctypes
import os
import signal
import time

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL, exit_code: int = 1) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. With parent_pid, exit at once
    (exit_code) if the parent died before the request took effect (we were re-parented already)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(exit_code)


class StopSignals:
    """Counts SIGTERM/SIGINT for a loop that polls it. A plain counter on purpose: threading.Event.set() in a
    handler can deadlock when the signal lands while the main thread holds the Event's own lock (in its
    wait), and an exception raised from a handler can land inside subprocess's bookkeeping."""

    def __init__(self, poll_s: float = 0.05):
        self.signals = 0
        self.poll_s = poll_s

    @property
    def requested(self) -> bool:
        return self.signals > 0

    def handler(self, *_) -> None:
        self.signals += 1

    def install(self, signums=(signal.SIGTERM, signal.SIGINT)) -> dict:
        """Route these signals here; returns the handlers they had."""
        return {signum: signal.signal(signum, self.handler) for signum in signums}

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` in short naps; True once a stop was requested."""
        deadline = time.monotonic() + seconds
        while not self.requested and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return self.requested
