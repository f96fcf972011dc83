"""Child-process plumbing for `blink serve`: each child pinned to its CPUs and dying with the parent.

Children are started as `python -m blink.entrypoints.processes --cpus LIST --nice N --parent PID -- CMD...`:
this sets PR_SET_PDEATHSIG (so a SIGKILLed parent leaves no orphan), the CPU affinity and the niceness,
then execs CMD; all survive exec, and the niceness is set while the process has one thread, so every
thread it starts later inherits it. Doing it here instead of in a preexec_fn keeps fork() free of Python
code.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from blink.util.cpus import parse_cpu_list
from blink.util.processes import die_with_parent


def child_command(command: list[str], cpus: str | None, nice: int | None = None) -> list[str]:
    """The argv that runs `command` pinned to `cpus` at niceness `nice`, killed when this process dies."""
    wrapper = [sys.executable, "-m", "blink.entrypoints.processes", "--parent", str(os.getpid())]
    if cpus:
        wrapper += ["--cpus", cpus]
    if nice is not None:
        wrapper += ["--nice", str(nice)]
    return wrapper + ["--", *command]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="exec a command pinned to CPUs, dying with its parent")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--cpus", default=None)
    parser.add_argument("--nice", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    die_with_parent(args.parent, signal.SIGKILL)
    if args.cpus:
        os.sched_setaffinity(0, parse_cpu_list(args.cpus))
    if args.nice is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as e:  # a negative niceness needs root or CAP_SYS_NICE
            print(f"cannot set niceness {args.nice}: {e.strerror} (below 0 needs root or CAP_SYS_NICE)",
                  file=sys.stderr, flush=True)
            return 2
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
