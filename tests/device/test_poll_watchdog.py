"""PollWatchdog: the silent hang of a device-wide synchronize behind the resident loop becomes a message
naming the stalled line; a caller that keeps polling, or an idle engine, hears nothing."""
from __future__ import annotations

import threading
import time

import pytest

from blink.device.poll_watchdog import PollWatchdog, in_torch_cuda

pytestmark = pytest.mark.timeout(60)

# Stands in for torch.cuda.synchronize(): a Python function in torch/cuda/ blocking in a C call.
_FAKE_TORCH_CUDA = compile("def synchronize(lock):\n    lock.acquire()\n    lock.release()\n",
                           "/venv/site-packages/torch/cuda/__init__.py", "exec")


class Blocker:
    """A C-level wait (lock.acquire has no Python frame of its own), released by release()."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()

    def release(self) -> None:
        self.lock.release()


def fake_synchronize(blocker: Blocker) -> None:
    scope: dict = {}
    exec(_FAKE_TORCH_CUDA, scope)
    scope["synchronize"](blocker.lock)


def wait_until(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


@pytest.fixture
def watch():
    made = []

    def factory(busy=lambda: False):
        out: list[str] = []
        w = PollWatchdog(busy, lambda: "steps=7 waiting=0", after_s=0.2, write=out.append).start()
        made.append(w)
        return w, out

    yield factory
    for w in made:
        w.stop()


def test_a_caller_stuck_in_torch_cuda_is_named_even_with_nothing_live(watch):
    w, out = watch()
    release = Blocker()

    def caller():  # the bench: engine built, then torch.cuda.synchronize() before the first request
        w.poked()
        fake_synchronize(release)

    t = threading.Thread(target=caller)
    t.start()
    try:
        assert wait_until(lambda: w.warnings == 1)
        text = out[0]
        assert "torch.cuda.current_stream().synchronize()" in text and "steps=7 waiting=0" in text
        assert "in caller" in text and "in synchronize" in text  # the stalled thread's stack
        time.sleep(0.5)
        assert w.warnings == 1  # once per stall
    finally:
        release.release()
        t.join()


def test_live_requests_without_polling_warn_and_polling_again_rearms(watch):
    live = {"n": 1}
    w, out = watch(busy=lambda: live["n"] > 0)
    assert wait_until(lambda: w.warnings == 1)
    assert "not polled for" in out[0]
    w.poked()
    assert wait_until(lambda: w.warnings == 2)  # a new stall after the poll warns again
    live["n"] = 0
    w.poked()
    time.sleep(0.5)
    assert w.warnings == 2


def test_a_polling_caller_or_an_idle_engine_hears_nothing(watch):
    w, out = watch(busy=lambda: True)
    for _ in range(40):  # 0.8 s of regular polling, each gap well under after_s
        w.poked()
        time.sleep(0.02)
    w.stop()
    assert w.warnings == 0 and out == []
    idle, idle_out = watch(busy=lambda: False)
    time.sleep(0.6)
    assert idle.warnings == 0 and idle_out == []


def test_in_torch_cuda_looks_at_the_innermost_frame():
    assert not in_torch_cuda(None)
    seen = {}
    release = Blocker()
    t = threading.Thread(target=fake_synchronize, args=(release,))
    t.start()
    try:
        import sys

        assert wait_until(lambda: in_torch_cuda(sys._current_frames().get(t.ident)))
        seen["main"] = in_torch_cuda(sys._current_frames()[threading.get_ident()])
    finally:
        release.release()
        t.join()
    assert seen["main"] is False
