"""The shared-prefix control-gap self-test's CPU parts (tools/device_selftest/selftest_prefix.py): its
workload and its reading of the trace (the GPU run itself: `tools/gpu_run.sh device-prefix`)."""
from __future__ import annotations

import numpy as np

from blink.device import structs
from tools.device_selftest.selftest_prefix import admission_plan_us, shared_prefix_mixed


def test_every_request_starts_with_the_same_2000_tokens():
    work = shared_prefix_mixed(50, vocab=1000)
    prefix = work[0][1][:2000]
    assert all(p[:2000] == prefix and 2001 <= len(p) <= 2650 for _, p, _ in work)
    assert len({tuple(p[2000:]) for _, p, _ in work}) == 50, "suffixes are unique"


def test_the_plan_phase_is_read_on_admitting_steps_only():
    trace = np.zeros((4, structs.TRACE_WORDS), np.int64)
    sizes = [(8, 8), (120, 9), (8, 8), (300, 2)]  # (tokens, rows): steps 1 and 3 carried a prefill row
    for k, (tokens, rows) in enumerate(sizes):
        trace[k, structs.TRACE_META] = (tokens << 32) | rows
        trace[k, 4] = 1000 * k
        trace[k, 5] = 1000 * k + (50_000 if tokens > rows else 1_000)  # ns
    p50, p99, n = admission_plan_us(trace)
    assert n == 2 and p50 == 50.0 and p99 == 50.0
