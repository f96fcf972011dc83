"""SIGTERM for a benchmark that holds processes (`blink bench interference`): the run ends at a safe point, and its
`with` blocks stop its servers and attackers on the way out.

An exception raised from a signal handler can land inside subprocess.Popen's waitpid bookkeeping, and a teardown
then waits forever (`blink bench attack` hung that way in session 20). So the handler raises `Terminated` at once only
while the main thread waits in a block marked `interruptible()` (a point's load, a settle sleep, a server's health
polls: no Popen call inside); anywhere else it only notes the signal, and the next such block or `check()` raises."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Terminated(BaseException):  # noqa: N818 (a signal, like KeyboardInterrupt: `except Exception` must not eat it)
    """SIGTERM asked the run to end."""


class TermSignal:
    """Context manager: while open, SIGTERM ends the run through `Terminated` at the next safe point."""

    def __init__(self) -> None:
        self.pending = False
        self._depth = 0
        self._previous = None

    def __enter__(self) -> TermSignal:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum, frame) -> None:
        self.pending = True
        if self._depth:
            raise Terminated

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A wait that SIGTERM may cut short (it must not call into subprocess)."""
        self.check()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def check(self) -> None:
        """Raise Terminated if SIGTERM came while no wait was interruptible."""
        if self.pending:
            raise Terminated


def no_signal() -> contextlib.AbstractContextManager:
    """The default for code that may run without a TermSignal: a block that changes nothing."""
    return contextlib.nullcontext()
