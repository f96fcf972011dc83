"""Host mode's decode pace (issue 19, energy per token; `--decode-pace-ms`), the twin of device mode's
blink/device/csrc/sched_pace.h: a step that can only be decodes starts no sooner than the pace after the last step
began. At a given load a faster engine runs more, smaller steps, each reading every weight; the pace trades decode
speed for fewer, fuller steps. Prefills are never paced: a new request ends the wait. With a max batch
(`--decode-pace-max-batch`) only small batches are held: they read every weight for few tokens, and a full batch
keeps its speed."""
from __future__ import annotations

from blink.core.sequence import Sequence

PACE_SLICE_S = 1e-3  # the wait is slept in slices: the ring loop takes arrivals between them


class DecodePace:
    def __init__(self, pace_ms: float, max_batch: int = 0):
        self.pace_s = pace_ms / 1e3
        self.max_batch = max_batch  # 0: any batch
        self.last_start: float | None = None  # perf_counter when the last step began

    def wait_s(self, now: float, waiting: int, running: list[Sequence]) -> float:
        """Seconds the next step should wait: it can only be decodes (nothing waits, every running prompt is done),
        at most max_batch sequences run, and the pace since the last step began is not over."""
        if not self.pace_s or self.last_start is None or waiting or not running:
            return 0.0
        if self.max_batch and len(running) > self.max_batch:
            return 0.0
        left = self.last_start + self.pace_s - now
        return left if left > 0 and all(seq.is_decode for seq in running) else 0.0
