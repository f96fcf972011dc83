"""A counter read when a measurement window opens and again when it closes (CPU seconds, CPU energy)."""
from __future__ import annotations


class WindowMeter:
    """stop() gives the difference of the two readings, or None when either is missing (no counter, a process gone).
    Subclasses give _read, and _delta where a plain difference is not right."""

    def __init__(self):
        self._start = None

    def _read(self):
        raise NotImplementedError

    def _delta(self, start, end):
        return end - start

    def start(self) -> None:
        self._start = self._read()

    def stop(self):
        end = self._read()
        if self._start is None or end is None:
            return None
        return self._delta(self._start, end)
