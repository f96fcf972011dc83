"""CPU lists in the taskset / cpuset syntax, and pinning a whole process to one."""
from __future__ import annotations

import os


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11], sorted and without repeats. Raises ValueError for anything
    else, an empty list included."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"empty CPU list {text!r}")
    return sorted(cpus)


def format_cpu_list(cpus: list[int] | None) -> str:
    return ",".join(str(c) for c in cpus) if cpus else ""


def pin_process(cpus: list[int] | set[int]) -> None:
    """Pin every thread of this process (sched_setaffinity(0) would pin only the calling thread; torch's
    intra-op threads may exist already). Threads started later inherit the affinity."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
