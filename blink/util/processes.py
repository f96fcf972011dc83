"""Dying with the parent: no orphan engine, rank or attacker if the process that started it is killed outright."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL, exit_code: int = 1) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. With parent_pid, exit at once
    (exit_code) if the parent died before the request took effect (we were re-parented already)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(exit_code)
