"""Says loudly when the caller of an in-process DeviceEngine stops polling it while requests are live.

With device mode's scheduler kernel resident on the GPU, a device-wide synchronize on the calling thread
(torch.cuda.synchronize(), cudaDeviceSynchronize, torch.cuda.empty_cache(), freeing a CUDA graph or pool)
waits for that kernel, which only exits on stop_flag: the process hangs without a word. This thread
cannot unblock such a call, but it prints, once per stall, the stalled thread's stack (the offending line
is at its bottom) and the loop's live counters, so the hang explains itself. A stall counts when requests
are live, or when the thread sits in torch.cuda (the warm-up of `blink bench offline` synchronized before
submitting anything).
"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

STALL_WARN_S = 20.0  # an 8B prefill step is ~0.1 s and DeviceEngine.step returns within 0.05 s when idle


class PollWatchdog:
    def __init__(self, busy: Callable[[], bool], describe: Callable[[], str], after_s: float = STALL_WARN_S,
                 write: Callable[[str], object] | None = None):
        """busy(): requests are live (someone should be polling). describe(): state for the message; both
        run on the watchdog thread and must not call CUDA (it may block behind the stalled call)."""
        self.busy, self.describe, self.after_s = busy, describe, after_s
        self.write = write or (lambda text: (sys.stderr.write(text), sys.stderr.flush()))
        self.last_poll = time.monotonic()
        self.poller = threading.get_ident()
        self.warned = False
        self.warnings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="blink-device-poll-watchdog", daemon=True)

    def start(self) -> PollWatchdog:
        self._thread.start()
        return self

    def poked(self) -> None:
        """The engine was polled (step, add_request, abort_request) from the current thread."""
        self.last_poll = time.monotonic()
        self.poller = threading.get_ident()
        self.warned = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.after_s / 4)):
            idle = time.monotonic() - self.last_poll
            if self.warned or idle < self.after_s:
                continue
            if not (self.busy() or in_torch_cuda(sys._current_frames().get(self.poller))):
                continue
            self.warned = True
            self.write(self.message(idle))
            self.warnings += 1  # after the write: a reader that sees the count also sees the message

    def message(self, idle: float) -> str:
        frame = sys._current_frames().get(self.poller)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (that thread has exited)\n"
        return (f"\nblink DeviceEngine: not polled for {idle:.0f} s while requests are live or while in torch.cuda.\n"
                "If the thread below is inside a device-wide synchronize (torch.cuda.synchronize(), "
                "empty_cache(), a graph or pool being freed), it waits forever behind device mode's resident "
                "scheduler kernel: synchronize only torch's stream (torch.cuda.current_stream().synchronize()) "
                "or shut the engine down first.\n"
                f"device loop: {self.describe()}\n"
                f"stack of the thread that last polled the engine (most recent call last):\n{stack}")


def in_torch_cuda(frame) -> bool:
    """The thread's innermost Python frame is torch.cuda's (synchronize, empty_cache, graph teardown)."""
    if frame is None:
        return False
    path = frame.f_code.co_filename.replace("\\", "/")
    return "/torch/cuda/" in path
