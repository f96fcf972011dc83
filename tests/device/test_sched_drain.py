"""The device loop's drain: once the front end closes ingress, the loop serves everything already sent
(in the ring, waiting or running) and only then reports the drain over (scheduler.cu then exits)."""
from __future__ import annotations

import pytest

from blink.request import FinishReason, SamplingParams

pytestmark = pytest.mark.timeout(120)


def test_drain_waits_for_the_ring_the_queue_and_the_running(make):
    h = make(max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert not h.drain_done()  # idle but ingress open: not a drain
    for req_id in (1, 2, 3):  # three requests, two running at most: one waits
        h.submit(req_id, [5, 6, 7], params)
    h.seg.control.ingress_closed = 1
    assert not h.drain_done(), "descriptors still in the ring"
    h.step()
    i = h.info()
    assert (i["running"], i["waiting"]) == (2, 1)
    assert not h.drain_done(), "requests running and waiting"
    while h.info()["running"] or h.info()["waiting"]:
        assert not h.drain_done()
        h.step()
    assert h.drain_done()
    for req_id in (1, 2, 3):  # every accepted request was served to its end
        tokens, reason = h.outputs(req_id)
        assert len(tokens) == 6 and reason == FinishReason.LENGTH


def test_a_descriptor_after_the_last_idle_turn_keeps_the_loop_up(make):
    h = make()
    h.seg.control.ingress_closed = 1
    assert h.drain_done()
    # A descriptor that reached the ring before the flag (ordering the front end keeps) is still served.
    h.submit(9, [4, 4], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert not h.drain_done()
    h.run()
    assert h.outputs(9)[1] == FinishReason.LENGTH and h.drain_done()
