"""SIGTERM in the interference lab (blink/bench/stop_signal.py): raised only inside the waits marked interruptible,
held elsewhere until the next one or a check, and the previous handler back afterwards."""
import os
import signal
import threading
import time

import pytest

from blink.bench.stop_signal import Terminated, TermSignal


def sigterm_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_a_wait_marked_interruptible_ends_at_once():
    with TermSignal() as term:
        sigterm_in(0.1)
        t = time.monotonic()
        with pytest.raises(Terminated), term.interruptible():
            time.sleep(5)
        assert time.monotonic() - t < 2.0  # not the 5 s sleep


def test_outside_a_wait_the_signal_is_held_until_the_next_one():
    with TermSignal() as term:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler has run: it only noted the signal
        assert term.pending
        with pytest.raises(Terminated), term.interruptible():
            pytest.fail("the block must not start")
    with TermSignal() as term:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        with pytest.raises(Terminated):
            term.check()


def test_the_previous_handler_comes_back():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append(1))
    try:
        with TermSignal():
            assert signal.getsignal(signal.SIGTERM) != previous
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert seen == [1]
    finally:
        signal.signal(signal.SIGTERM, previous)
