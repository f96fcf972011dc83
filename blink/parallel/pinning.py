"""Per-rank CPU pinning (`--rank-cpus "0-3;4-7"`): each tensor-parallel rank process keeps to its own cores,
so that an attacker on one rank's cores slows that rank alone (the barrier experiment of issue 7)."""
from __future__ import annotations

import os


def parse_cpus(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (the taskset syntax). Raises ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part.strip()!r} in {text!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def parse_rank_cpus(text: str | None, size: int, check_available: bool = True) -> list[list[int]] | None:
    """--rank-cpus -> one CPU list per rank (None when not given). check_available: that this process
    may run on them (rank 0 checks before pinning itself; its workers inherit rank 0's narrowed mask)."""
    if not text:
        return None
    lists = [parse_cpus(part) for part in text.split(";")]
    if len(lists) != size:
        raise ValueError(f"--rank-cpus {text!r} gives {len(lists)} CPU lists for {size} tensor-parallel ranks")
    allowed = os.sched_getaffinity(0) if check_available else set().union(*lists)
    for rank, cpus in enumerate(lists):
        missing = sorted(set(cpus) - allowed)
        if missing:
            raise ValueError(f"--rank-cpus: rank {rank}'s CPUs {missing} are not available to this process")
    return lists


def pin_process(cpus: list[int] | set[int]) -> None:
    """Pin every thread of this process (sched_setaffinity(0) would pin only the calling thread; torch's
    intra-op threads may exist already). Threads started later inherit the affinity."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
