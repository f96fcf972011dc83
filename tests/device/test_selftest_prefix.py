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


def test_the_gap_phases_and_their_parts_are_read_from_the_right_stamps():
    """Two launches with every stamp 100 ns * k apart: each phase and part comes out as the stamps say."""
    from tools.device_selftest.selftest_trace import trace_stats

    col = {name: k for k, name in enumerate(structs.TRACE_PHASES)}
    trace = np.zeros((2, structs.TRACE_WORDS), np.int64)
    first = {"launch": 0, "done": 10_000, "rows": 11_000, "frees": 13_000, "finish": 16_000}
    second = {"ingest": 18_000, "scheduled": 21_000, "plan": 25_000, "inputs": 26_000, "launch": 26_500,
              "launched": 29_000, "done": 40_000}
    for k, stamps in enumerate((first, second)):
        trace[k, structs.TRACE_META] = (1 << 32) | 1
        for name, ns in stamps.items():
            trace[k, col[name]] = ns
    st = trace_stats(trace)
    expect = {"gap50": 16.5, "finish": 6.0, "rows": 1.0, "frees": 2.0, "records": 3.0, "ingest": 2.0, "plan": 7.0,
              "schedule": 3.0, "admissions": 4.0, "inputs": 1.0, "fence": 0.5, "launch call": 2.5}
    assert {k: st[k] for k in expect} == expect


def test_a_launch_ahead_is_read_apart_from_the_synchronous_phases():
    """Launch 2 went ahead (trace word 11): its gap is the check (-> its inputs stamp) and the fence, and the step
    before it finished after it launched; the synchronous phases come from launch 1 alone."""
    from tools.device_selftest.selftest_trace import phase_text, trace_stats

    col = {name: k for k, name in enumerate(structs.TRACE_PHASES)}
    trace = np.zeros((3, structs.TRACE_WORDS), np.int64)
    stamps = [{"launch": 0, "done": 10_000, "finish": 16_000},
              {"ingest": 18_000, "plan": 25_000, "inputs": 26_000, "launch": 26_500, "launched": 29_000,
               "done": 40_000, "finish": 52_000},
              {"ingest": 43_000, "plan": 43_000, "inputs": 43_000, "scheduled": 41_500, "launch": 44_000,
               "launched": 46_500, "ahead": 1}]
    for k, row in enumerate(stamps):
        trace[k, structs.TRACE_META] = (1 << 32) | 1
        for name, ns in row.items():
            trace[k, col[name]] = ns
    st = trace_stats(trace)
    assert (st["n"], st["n_ahead"]) == (2, 1)
    assert (st["ahead_gap50"], st["check"], st["ahead_fence"], st["ahead_launch"]) == (4.0, 3.0, 1.0, 2.5)
    assert (st["finish"], st["ingest"], st["plan"], st["fence"]) == (6.0, 2.0, 7.0, 0.5)  # launch 1's alone
    assert st["check_rows"] == 1.5
    assert "ahead 1 of 2: gap 4.00 = check 3.00 (rows 1.50) + fence 1.00" in phase_text(st)
