"""Host CPU time of a process (all its threads) from /proc, and the engine pid from the server's /metrics."""
from __future__ import annotations

import os
import re

import httpx

from blink.bench.window_meter import WindowMeter

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ENGINE_PID_GAUGE = "blink:engine_pid"


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process: /proc/<pid>/stat sums every thread, dead ones included."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def gauge_value(metrics_text: str, name: str) -> float | None:
    """The value of a Prometheus gauge (its first sample, labels ignored) in exposition text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", re.MULTILINE)
    match = pattern.search(metrics_text)
    return float(match.group(1)) if match else None


def engine_pid_from_metrics(base_url: str, timeout_s: float = 10.0) -> int | None:
    response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    response.raise_for_status()
    value = gauge_value(response.text, ENGINE_PID_GAUGE)
    return int(value) if value else None


class CpuMeter(WindowMeter):
    """CPU seconds a process spends between start() and stop(); None when it has no pid or vanished."""

    def __init__(self, pid: int | None):
        super().__init__()
        self.pid = pid

    def _read(self) -> float | None:
        if self.pid is None:
            return None
        try:
            return process_cpu_seconds(self.pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
