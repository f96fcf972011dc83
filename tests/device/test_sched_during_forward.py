"""The GPU loop's order around a launch (csrc/sched.h work_during_forward, issue 17's control gap), on the
host build: a step's records are written only once the next forward is launched, requests that arrive during a
forward are ingested while it runs, and an abort waits until its request's last tokens are out."""
from __future__ import annotations

import pytest

from blink.request import FinishReason, SamplingParams
from tests.device.harness import HostScheduler, reference

pytestmark = pytest.mark.timeout(120)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def expect(h: HostScheduler, prompt, params):
    c = h.cfg
    return reference(prompt, params, c.vocab_size, c.eos, c.max_model_len)


@pytest.mark.parametrize("team", [1, 4])
def test_records_wait_for_the_next_launch_and_arrivals_are_ingested_during_the_forward(make, team):
    h = make(team=team, defer_publish=True)
    h.submit(1, [5, 6, 7], greedy(6))
    h.step()
    assert 1 not in h.events, "the first token's record waits for the next launch"
    h.during_forward = lambda: h.submit(2, [8, 9], greedy(4))
    h.step()
    h.during_forward = None
    assert len(h.events[1]) == 1
    assert h.producer.descriptors.used() == 0 and h.info()["waiting"] == 1, "ingested while the forward ran"
    h.step()
    assert [rid for rid, *_ in h.plans[2]] == [1, 2], "planned into the very next step"
    h.run()
    for rid, prompt, n in ((1, [5, 6, 7], 6), (2, [8, 9], 4)):
        assert h.outputs(rid) == expect(h, prompt, greedy(n))


@pytest.mark.parametrize("team", [1, 4])
def test_an_abort_during_a_forward_lands_after_its_requests_last_token(make, team):
    h = make(team=team, defer_publish=True)
    h.submit(1, [5, 6, 7], greedy(20))
    h.submit(2, [4], greedy(6))
    for _ in range(3):
        h.step()
    h.during_forward = lambda: h.abort(1)
    h.step()  # the forward of step 4 holds request 1's row: the abort stays in the ring
    h.during_forward = None
    assert h.producer.descriptors.used() == 1 and h.info()["running"] == 2
    h.step()  # the gap: step 4's records first (pending), then the abort
    tokens, reason = h.outputs(1)  # positions 0.., one finish, last
    assert reason == FinishReason.ABORT and len(tokens) == 4
    assert tokens == expect(h, [5, 6, 7], greedy(20))[0][:4]
    h.run()
    assert h.outputs(2) == expect(h, [4], greedy(6))
    i = h.info()
    assert (i["running"], i["waiting"], i["free_blocks"]) == (0, 0, h.cfg.num_blocks)
