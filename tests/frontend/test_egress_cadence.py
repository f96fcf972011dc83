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
    # the steps shorten to 2 ms: each burst is found at the reader's wake-up, which shrinks the minimum
    t, sleeps = start, []
    for _ in range(12):
        sleep = _burst(cadence, t)
        sleeps.append(sleep)
        t = max(t + 0.002, t + POLL + sleep)  # records wait for the reader if it sleeps past them
    assert sleeps[-1] <= 0.75 * 0.002  # back within the step
    assert max(sleeps) <= 0.0075


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
    cadence.records(0.030, backlog=True)
    assert cadence.empty(0.0301) == POLL  # not the long sleep
    cadence.records(0.0302)  # the rest of the step: the same burst
    assert abs(cadence.empty(0.0303) - (0.030 + 0.0075 - 0.0303)) < 1e-9
    assert list(cadence.intervals) == pytest.approx([0.010, 0.010])
