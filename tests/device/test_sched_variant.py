"""Which of its bucket's graphs a step launches (csrc/sched_variant.h): the searchless one exactly when no row of
the step that samples needs the sampler's search (SamplingParams.needs_search, the rule ModelRunner.needs_search
applies in host mode), in the synchronous path and for steps launched ahead; with one variant, never."""
from __future__ import annotations

import random

import pytest

from blink.request import SamplingParams
from tests.device.harness import HostScheduler, reference

pytestmark = pytest.mark.timeout(120)

KINDS = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=5),
         dict(temperature=0.9, min_p=0.1), dict(temperature=0.0, logprobs=3), dict(temperature=0.5, logprobs=0),
         dict(temperature=0.0, top_k=5, top_p=0.5),  # greedy: its filter never applies
         dict(temperature=1.1, repetition_penalty=1.2, presence_penalty=0.3)]


def workload(seed: int, n: int, kinds: list[dict]) -> list[tuple[int, list[int], SamplingParams]]:
    rng = random.Random(seed)
    return [(rid, [rng.randrange(2, 50) for _ in range(rng.randrange(1, 12))],
             SamplingParams(max_tokens=rng.randrange(1, 20), seed=rid, **rng.choice(kinds)))
            for rid in range(1, n + 1)]


def run_checked(h: HostScheduler, reqs) -> list[bool]:
    """Runs the requests a few at a time; returns, per step, whether it took the searchless graph, after checking
    it against the rule over the plan's sampling rows."""
    params = {rid: p for rid, _, p in reqs}
    expected = []
    h.after_prepare = lambda parity, bucket: expected.append(
        not any(params[rid].needs_search for rid, _, _, samples in h.plans[-1] if samples))
    pending = list(reqs)
    while pending or h.busy():
        while pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2 and random.random() < 0.5:
            h.submit(*pending.pop(0))
        if not h.busy() and pending:
            h.submit(*pending.pop(0))
        h.step()
    h.step()
    for rid, prompt, p in reqs:  # the fake forward ignores the variant: what matters is that nothing is lost
        assert h.outputs(rid) == reference(prompt, p, h.cfg.vocab_size, h.cfg.eos, h.cfg.max_model_len), rid
    assert len(h.searchless) == len(expected) == len(h.plans)
    return h.searchless, expected


@pytest.mark.parametrize(("team", "ahead"), [(1, False), (4, False), (3, True), (5, True)])
def test_a_step_is_searchless_exactly_when_no_sampling_row_needs_the_search(make, team, ahead):
    random.seed(team)
    h = make(max_num_seqs=4, max_num_batched_tokens=8, num_blocks=48, max_requests=12, max_model_len=40,
             vocab_size=50, team=team, defer_publish=ahead, launch_ahead=ahead)
    got, expected = run_checked(h, workload(team, 60, KINDS))
    assert got == expected
    assert 5 < sum(got) < len(got) - 5, "both variants were planned, many times"
    if ahead:
        assert h.ahead_counts()[0] > 10, "steps launched ahead kept their variant (finish_behind checks it)"


def test_unfiltered_decodes_stay_searchless_and_one_variant_never_is(make):
    plain = [dict(temperature=0.0), dict(temperature=0.8, frequency_penalty=0.5)]
    reqs = workload(3, 20, plain)
    h = make(max_num_seqs=4, max_num_batched_tokens=8, num_blocks=48, max_requests=12, max_model_len=40, team=2)
    got, _ = run_checked(h, reqs)
    assert all(got)
    h = make(max_num_seqs=4, max_num_batched_tokens=8, num_blocks=48, max_requests=12, max_model_len=40, team=2,
             sampler_variants=1)
    got, _ = run_checked(h, reqs)
    assert not any(got)
