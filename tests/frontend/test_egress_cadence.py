"""The egress reader's sleeps while requests are in flight (blink/frontend/egress_cadence.py): it polls
every poll_s until it knows the steps' rhythm, then sleeps through the silent part of each step, and a
step that got shorter is learnt within a few bursts."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blink.frontend.egress_cadence import EgressCadence

POLL = 100e-6


def _burst(cadence: EgressCadence, start: float, polls_with_records: int = 1) -> float:
    """Records read at `start` (over a few polls), then an empty poll: returns the sleep it asks for."""
    for i in range(polls_with_records):
        cadence.records(start + i * POLL)
    return cadence.empty(start + polls_with_records * POLL)


def test_polls_every_poll_s_until_the_rhythm_is_known():
    cadence = EgressCadence(POLL, fraction=0.75, history=4)
    sleeps = [_burst(cadence, 0.010 * i) for i in range(5)]
    assert sleeps[:4] == [POLL] * 4  # 0-3 intervals seen
    assert abs(sleeps[4] - (0.75 * 0.010 - POLL)) < 1e-9  # the 5th burst: wake at 7.5 ms into the step


def test_only_the_first_empty_poll_after_a_burst_sleeps_long():
    cadence = EgressCadence(POLL, fraction=0.75, history=2)
    for i in range(3):
        _burst(cadence, 0.010 * i)
    assert cadence.empty(0.0205) == POLL  # later empty polls in the same step: back to poll_s


def test_a_burst_read_over_several_polls_counts_once():
    cadence = EgressCadence(POLL, fraction=0.5, history=2)
    for i in range(3):
        _burst(cadence, 0.010 * i, polls_with_records=3)
    assert list(cadence.intervals) == pytest.approx([0.010, 0.010])


def test_a_shorter_step_is_learnt():
    cadence = EgressCadence(POLL, fraction=0.75, history=2)
    start = 0.0
    for _ in range(3):
        _burst(cadence, start)
        start += 0.010
    # the steps shorten to 2 ms: the first burst is found late, at the reader's wake-up after a long sleep;
    # it forgets the rhythm, polls every poll_s while it times two intervals, then sleeps within the step
    cadence.empty(start - 0.0024)  # the wake-up after the last 10 ms burst's sleep: nothing yet
    t, sleeps = start, []
    for _ in range(6):
        sleep = _burst(cadence, t)
        sleeps.append(sleep)
        t_next = t + 0.002
        wake = t + POLL + sleep
        if wake > t_next:  # the reader sleeps past the burst: found at its wake-up
            t_next = wake
        else:
            cadence.empty(wake)  # it wakes (or polls) before the burst and finds nothing
        t = t_next
    assert sleeps[0] > 0.002  # the old rhythm: past the next burst
    assert sleeps[1:4] == [POLL] * 3  # found late: relearning
    assert POLL < sleeps[4] <= 0.75 * 0.002 and POLL < sleeps[5] <= 0.75 * 0.002  # within the 2 ms step


def test_a_burst_found_late_is_not_timed():
    """Found by the first poll after a long sleep, a burst's start is unknown: no interval from it, and
    the rhythm is learnt again; a starved reader so falls back to polling every poll_s."""
    cadence = EgressCadence(POLL, fraction=0.75, history=2)
    for i in range(3):
        _burst(cadence, 0.010 * i)
    assert _burst(cadence, 0.035) == POLL  # found at 35 ms, after the 7.4 ms sleep: late
    assert len(cadence.intervals) == 0
    assert _burst(cadence, 0.040) == POLL  # timed exactly, but no interval yet (the one before is unknown)
    assert list(cadence.intervals) == []


def test_idle_forgets_the_rhythm():
    cadence = EgressCadence(POLL, fraction=0.75, history=2)
    for i in range(4):
        _burst(cadence, 0.010 * i)
    cadence.idle()
    assert _burst(cadence, 1.0) == POLL and _burst(cadence, 1.01) == POLL


@given(st.lists(st.floats(0.0005, 0.05), min_size=1, max_size=40))
def test_sleeps_stay_within_poll_s_and_the_cap(steps):
    cadence = EgressCadence(POLL, fraction=0.75, history=3, max_sleep_s=0.02)
    t = 0.0
    for step in steps:
        sleep = _burst(cadence, t)
        assert POLL <= sleep <= 0.02
        t += max(step, POLL + sleep)


def test_a_read_of_half_the_ring_keeps_polling_after_its_first_empty_poll():
    """The engine may be waiting for room to write the rest of its step: that burst is not over yet."""
    cadence = EgressCadence(POLL, fraction=0.75, history=2)
    for i in range(3):
        _burst(cadence, 0.010 * i)
    assert cadence.empty(0.0276) == POLL  # the poll after the long sleep: nothing yet
    cadence.records(0.030, backlog=True)
    assert cadence.empty(0.0301) == POLL  # not the long sleep
    cadence.records(0.0302)  # the rest of the step: the same burst
    assert abs(cadence.empty(0.0303) - (0.030 + 0.0075 - 0.0303)) < 1e-9
    assert list(cadence.intervals) == pytest.approx([0.010, 0.010])
