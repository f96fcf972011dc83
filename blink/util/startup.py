"""Start-up phase lines ("blink engine: +41.2 s graphs captured"): where a slow start spends its time.

Printed to stderr, which `blink serve` holds back until the server is ready and shows in full if the start
fails or is stopped first (entrypoints/children.py), so a start cut by a benchmark's timeout says how far
it got. Seconds count from this module's import, early in the process.
"""
from __future__ import annotations

import sys
import time

_T0 = time.monotonic()


def phase(role: str, what: str) -> None:
    print(f"blink {role}: +{time.monotonic() - _T0:.1f} s {what}", file=sys.stderr, flush=True)
