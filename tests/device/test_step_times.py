"""Device mode's step times come from the scheduler's %globaltimer trace: launch to next launch, with a
period in which the loop idled (no work) left out, so that a benchmark's step percentiles hold only steps."""
from __future__ import annotations

import numpy as np

from blink.device import structs
from blink.device.engine import step_times_from_trace


def _trace(launches_ns: list[int], rows: list[int], tokens: list[int], idle_before: set[int]) -> np.ndarray:
    t = np.zeros((len(launches_ns), structs.TRACE_WORDS), dtype=np.int64)
    for i, start in enumerate(launches_ns):
        t[i, 0] = start
        t[i, 1] = start + 900_000  # forward done
        t[i, 2] = (tokens[i] << 32) | rows[i]
        t[i, 3] = start + 905_000  # finish phase done
        # ingest of this step: right after the previous finish, or long after when the loop idled first
        t[i, 4] = start - 10_000 if i == 0 else (t[i - 1, 3] + (start - t[i - 1, 3] - 8_000 if i in idle_before
                                                             else 2_000))
    return t


def test_back_to_back_steps_are_launch_to_launch_and_idle_periods_are_dropped():
    launches = [0, 1_000_000, 2_000_000, 50_000_000, 51_000_000]  # an idle 47 ms before launch 3
    t = _trace(launches, rows=[4, 4, 4, 2, 2], tokens=[300, 4, 4, 2, 2], idle_before={3})
    got = step_times_from_trace(t)
    assert [round(s.seconds * 1e3, 3) for s in got] == [1.0, 1.0, 1.0]
    assert [(s.num_tokens, s.num_seqs) for s in got] == [(300, 4), (4, 4), (2, 2)]


def test_no_launch_or_one_launch_gives_no_step():
    assert step_times_from_trace(np.zeros((0, structs.TRACE_WORDS), dtype=np.int64)) == []
    assert step_times_from_trace(_trace([5], [1], [1], set())) == []
