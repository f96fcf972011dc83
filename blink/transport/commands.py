"""Commands through the control block that are not requests: a word the front end bumps and the engine
loop (host mode's Python loop, or the GPU's, between steps) applies, then acknowledges with its own word.
No CPU is needed per step in device mode: the GPU reads the word with the ingress tail it reads anyway."""
from __future__ import annotations

import time
from collections.abc import Callable

MASK32 = 0xFFFFFFFF


def request_prefix_cache_reset(control, timeout_s: float) -> bool:
    """Ask the engine to forget its cached KV blocks and wait until it has (False: it did not in time)."""
    want = (control.reset_prefix_cache + 1) & MASK32
    control.reset_prefix_cache = want
    deadline = time.monotonic() + timeout_s
    while control.prefix_cache_resets != want:
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


def apply_prefix_cache_reset(control, reset: Callable[[], object]) -> None:
    """Engine side (host mode): run `reset` once per new command, then acknowledge it."""
    want = control.reset_prefix_cache
    if control.prefix_cache_resets != want:
        reset()
        control.prefix_cache_resets = want
