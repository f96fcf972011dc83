"""Per-rank CPU pinning (`--rank-cpus "0-3;4-7"`): each tensor-parallel rank process keeps to its own cores,
so that an attacker on one rank's cores slows that rank alone (the barrier experiment of issue 7)."""
from __future__ import annotations

import os

from blink.util.cpus import parse_cpu_list


def parse_rank_cpus(text: str | None, size: int, check_available: bool = True) -> list[list[int]] | None:
    """--rank-cpus -> one CPU list per rank (None when not given). check_available: that this process
    may run on them (rank 0 checks before pinning itself; its workers inherit rank 0's narrowed mask)."""
    if not text:
        return None
    lists = [parse_cpu_list(part) for part in text.split(";")]
    if len(lists) != size:
        raise ValueError(f"--rank-cpus {text!r} gives {len(lists)} CPU lists for {size} tensor-parallel ranks")
    allowed = os.sched_getaffinity(0) if check_available else set().union(*lists)
    for rank, cpus in enumerate(lists):
        missing = sorted(set(cpus) - allowed)
        if missing:
            raise ValueError(f"--rank-cpus: rank {rank}'s CPUs {missing} are not available to this process")
    return lists
