"""Device mode's decode pace (issue 19, energy; csrc/sched_pace.h) built for the host: which steps wait, how long,
and what ends a wait early. The bounds on time guard against stalls (a wait that ignores an arrival takes the
whole 5 s pace); none of them times the scheduler."""
from __future__ import annotations

import ctypes as C
import threading
import time

import pytest

from blink.request import SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def pace(h, ms: float, ago_ms: float = 0.0, max_batch: int = 0) -> float:
    """Set the pace, then run the loop's wait as if the last launch was ago_ms ago: the seconds it waited."""
    h.params.cfg.decode_pace_us = int(ms * 1000)
    h.params.cfg.decode_pace_max_batch = max_batch
    return h.lib.blink_sched_pace(C.byref(h.params), h.cfg.team, int(ago_ms * 1e6)) / 1e9


@pytest.fixture(params=[1, 3], ids=["leader", "team3"])
def decoding(make, request):
    """A scheduler whose last step was all decodes: one request admitted, then one decode step."""
    h = make(team=request.param)
    h.submit(1, [5, 6, 7], PARAMS)
    assert h.step() == 1 and h.step() == 1
    assert h.info()["waiting"] == 0 and h.info()["running"] == 1
    return h


def test_a_decode_step_waits_out_the_pace_from_the_last_launch(decoding):
    assert pace(decoding, 0) == 0.0, "0 is off"
    waited = pace(decoding, 200, ago_ms=50)
    assert 0.14 <= waited < 1.0
    assert pace(decoding, 200, ago_ms=250) == 0.0, "the pace is over already"


def test_a_max_batch_holds_small_batches_only(make):
    h = make()
    for i in range(3):
        h.submit(i, [5 + i, 6, 7], PARAMS)
    assert h.step() == 3 and h.step() == 3
    assert h.info()["running"] == 3
    assert pace(h, 200, max_batch=3) > 0.1, "three running, at the max: held"
    t0 = time.monotonic()
    assert pace(h, 5000, max_batch=2) == 0.0 and time.monotonic() - t0 < 0.5, "above the max: no wait"


def test_only_decodes_are_paced_and_a_queue_is_not(make):
    h = make(max_num_seqs=1)
    h.submit(1, list(range(2, 30)), PARAMS)  # 28 tokens: two prefill chunks of the 16-token budget
    assert h.step() == 1
    assert pace(h, 5000) == 0.0, "a prompt is left to prefill"
    assert h.step() == 1
    assert pace(h, 200) > 0.1, "its prompt is done: only its decode is left"
    h.submit(2, [8, 9], PARAMS)
    h.step()  # the words the pace read last are this plan's: the arrival is taken by the next one
    h.step()
    assert h.info()["waiting"] == 1 and h.info()["running"] == 1, "queued behind the one sequence slot"
    t0 = time.monotonic()
    assert pace(h, 5000) == 0.0 and time.monotonic() - t0 < 0.5, "a queue is never paced"


def test_a_request_arriving_during_the_wait_ends_it_and_is_planned_next(decoding):
    h = decoding
    timer = threading.Timer(0.05, lambda: h.submit(2, [8, 9], PARAMS))
    timer.start()
    try:
        waited = pace(h, 5000)
    finally:
        timer.join()
    assert 0.03 <= waited < 0.5
    rows = h.step()
    assert rows == 2 and h.info()["running"] == 2, "the arrival is in the very next plan"


def test_a_stop_ends_the_wait(decoding):
    h = decoding
    timer = threading.Timer(0.05, lambda: setattr(h.seg.control, "stop_flag", 1))
    timer.start()
    try:
        assert pace(h, 5000) < 0.5
    finally:
        timer.join()


def test_the_last_steps_tokens_are_out_before_the_wait(make):
    """The GPU loop writes a step's records after the next launch; a paced step must not hold them back."""
    h = make(defer_publish=True)
    h.submit(1, [5, 6, 7], PARAMS)
    h.step()
    h.step()
    before = len(h.events.get(1, []))
    pace(h, 30)
    h.drain()
    assert len(h.events[1]) == before + 1


def test_paced_tokens_equal_unpaced_ones(make):
    a, b = make(), make()
    for h in (a, b):
        for i in range(3):
            h.submit(i, [5 + i, 6, 7], PARAMS)
    b.params.cfg.decode_pace_us = 2000
    a.run()
    steps = 0
    while b.busy() and steps < 200:
        b.lib.blink_sched_pace(C.byref(b.params), 1, 0)
        b.step()
        steps += 1
    for i in range(3):
        assert b.outputs(i) == a.outputs(i)
