"""Which code measured a point: repeats of one point are merged across sessions, and the code changes between
them, so every point records the source it ran. The device machine gets a copy of the working tree without
.git, so beside the commit (None there) a hash of blink/'s sources names the code wherever it runs."""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

import blink

SOURCE_SUFFIXES = (".py", ".h", ".cu", ".cuh", ".cpp")


@functools.cache
def code_version() -> dict:
    """{"commit": HEAD's sha or None, "dirty": uncommitted changes under blink/ or None, "source_sha": 12 hex
    digits over blink/'s source files (paths and contents)}."""
    root = Path(blink.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {**_git(root.parent), "source_sha": digest.hexdigest()[:12]}


def _git(repo: Path) -> dict:
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "blink"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}
