import os
import signal
import threading
import time

from blink.util.processes import StopSignals


def test_a_signal_ends_the_wait_and_is_counted():
    stop = StopSignals(poll_s=0.01)
    previous = stop.install((signal.SIGUSR1,))
    try:
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        started = time.monotonic()
        assert stop.wait(30.0)
        assert time.monotonic() - started < 5.0  # ended by the signal, not by the 30 s
        assert stop.signals == 1 and stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(0.0) and stop.signals == 2  # a second signal is seen (serve's "cut now")
    finally:
        signal.signal(signal.SIGUSR1, previous[signal.SIGUSR1])


def test_without_a_signal_the_wait_times_out():
    stop = StopSignals(poll_s=0.01)
    assert not stop.wait(0.05) and stop.signals == 0


def test_install_returns_the_handlers_it_replaced():
    sentinel = lambda *_: None  # noqa: E731
    previous = signal.signal(signal.SIGUSR2, sentinel)
    try:
        stop = StopSignals()
        assert stop.install((signal.SIGUSR2,)) == {signal.SIGUSR2: sentinel}
        assert signal.getsignal(signal.SIGUSR2) == stop.handler
    finally:
        signal.signal(signal.SIGUSR2, previous)
