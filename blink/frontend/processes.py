"""Child-process plumbing for `blink serve`: CPU lists, pinning, dying with the parent.

Children are started as `python -m blink.frontend.processes --cpus LIST --parent PID -- CMD...`: this
sets PR_SET_PDEATHSIG (so a SIGKILLed parent leaves no orphan) and the CPU affinity, then execs CMD;
both survive exec. Doing it here instead of in a preexec_fn keeps fork() free of Python code.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}. Raises ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"empty CPU list {text!r}")
    return cpus


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` when our parent dies; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def child_command(command: list[str], cpus: str | None) -> list[str]:
    """The argv that runs `command` pinned to `cpus`, killed when this process dies."""
    wrapper = [sys.executable, "-m", "blink.frontend.processes", "--parent", str(os.getpid())]
    if cpus:
        wrapper += ["--cpus", cpus]
    return wrapper + ["--", *command]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="exec a command pinned to CPUs, dying with its parent")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--cpus", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    die_with_parent(args.parent, signal.SIGKILL)
    if args.cpus:
        os.sched_setaffinity(0, parse_cpu_list(args.cpus))
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
