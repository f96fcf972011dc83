"""Launching ahead (csrc/sched_ahead.h, issue 17's control gap), on the host build in the GPU loop's order: while a
forward runs the next step's inputs are written, and once its tokens are in that step is launched if nothing
changed. It must never change what is computed: the same records as the synchronous path, and every change (a stop,
an arrival, an abort, a length limit, a full KV pool) falls back to it."""
from __future__ import annotations

import random

import pytest

from blink.request import FinishReason, SamplingParams
from tests.device.harness import HostScheduler, reference

pytestmark = pytest.mark.timeout(120)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def expect(h: HostScheduler, prompt, params):
    c = h.cfg
    return reference(prompt, params, c.vocab_size, c.eos, c.max_model_len)


def records(h: HostScheduler) -> dict[int, list[tuple]]:
    return {rid: [(e.token_id, e.position, e.finish_reason, e.logprob, e.cached_tokens, e.top_ids) for e in evs]
            for rid, evs in h.events.items()}


def workload(seed: int, n: int) -> list[tuple[int, list[int], SamplingParams]]:
    """Requests that stop every way: EOS, stop ids, min_tokens, max_tokens, max_model_len, with shared prefixes."""
    rng = random.Random(seed)
    shared = [rng.randrange(2, 50) for _ in range(8)]
    kinds = [lambda: greedy(rng.randrange(1, 30)), lambda: greedy(30, ignore_eos=True),
             lambda: greedy(25, min_tokens=4), lambda: greedy(40, stop_token_ids=[7, 11, 13], ignore_eos=True),
             # stop ids and EOS in one check; more than a check row holds (sched_entry.h kAheadIds = 7: the entry's)
             lambda: greedy(40, stop_token_ids=[7, 11], min_tokens=2),
             lambda: greedy(40, stop_token_ids=[3, 5, 9, 17, 19, 23, 29, 31, 37], min_tokens=3)]
    out = []
    for rid in range(1, n + 1):
        prefix = shared if rng.random() < 0.5 else []
        prompt = prefix + [rng.randrange(2, 50) for _ in range(rng.randrange(1, 10))]
        out.append((rid, prompt, rng.choice(kinds)()))
    return out


def run_staggered(h: HostScheduler, reqs, seed: int) -> None:
    """Arrivals during forwards, at random but by the forward's number (so both paths see the same), and when idle."""
    rng = random.Random(seed)
    pending = list(reqs)

    def arrive():
        for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):
            if pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2:
                h.submit(*pending.pop(0))

    h.during_forward = arrive
    steps = 0
    while pending or h.busy():
        if not h.busy():
            h.submit(*pending.pop(0))
        h.step()
        steps += 1
        assert steps < 20_000
    h.during_forward = None
    h.step()  # the idle turn publishes the last records


@pytest.mark.parametrize(("team", "prefix_caching"), [(1, False), (4, True), (5, False)])
def test_launching_ahead_gives_the_records_of_the_synchronous_path(make, team, prefix_caching):
    cfg = dict(max_num_seqs=6, max_num_batched_tokens=16, num_blocks=40, max_requests=12, max_model_len=48,
               eos=(1,), vocab_size=50, team=team, defer_publish=True, prefix_caching=prefix_caching)
    reqs = workload(7, 120)
    runs = {}
    for ahead in (False, True):
        h = make(**cfg, launch_ahead=ahead)
        run_staggered(h, reqs, seed=11)
        runs[ahead] = h
    sync, ahead = runs[False], runs[True]
    for rid, prompt, params in reqs:
        assert ahead.outputs(rid) == expect(ahead, prompt, params), rid
    assert ahead.plans == sync.plans, "the same steps"
    assert records(ahead) == records(sync)
    launched, missed = ahead.ahead_counts()
    assert launched > 10 and missed > 3, (launched, missed)  # both paths ran, many times
    assert sync.ahead_counts() == (0, 0)
    reasons = {ahead.outputs(rid)[1] for rid, *_ in reqs}
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH}


def test_steady_decodes_go_ahead_across_block_boundaries_until_a_length_limit(make):
    h = make(max_num_seqs=4, max_num_batched_tokens=16, block_size=4, num_blocks=32, max_model_len=40, eos=(),
             team=3, defer_publish=True, launch_ahead=True)
    reqs = [(rid, [rid + 2] * (rid + 1), greedy(20 + 3 * rid)) for rid in range(1, 5)]
    for req in reqs:
        h.submit(*req)
    assert h.step() == 4 and len(h.plans) == 1  # the prefill: admissions, nothing ahead
    h.step()  # every decode step goes ahead until request 1 reaches its length limit (23 tokens)
    assert len(h.plans) == 1 + 22 and h.ahead_counts() == (21, 0), "one plan, then 21 steps launched ahead"
    assert all(len(plan) == 4 and all(n == 1 for _, _, n, _ in plan) for plan in h.plans[1:])
    h.run()
    for rid, prompt, params in reqs:
        assert h.outputs(rid) == (expect(h, prompt, params)[0], FinishReason.LENGTH)
    launched, missed = h.ahead_counts()
    assert launched > 21 and missed == 0, (launched, missed)  # nothing stops a row but its length limit


def test_an_arrival_during_a_forward_is_planned_into_the_very_next_step(make):
    h = make(team=4, defer_publish=True, launch_ahead=True, max_num_seqs=4)
    h.submit(1, [5, 6, 7], greedy(12, ignore_eos=True))
    h.step()  # the prefill
    calls = []

    def arrive():
        calls.append(len(h.plans))
        if len(calls) == 4:
            h.submit(2, [8, 9], greedy(4, ignore_eos=True))

    h.during_forward = arrive
    h.step()
    h.during_forward = None
    n = calls[3]  # plans at the arrival: the forward of plan n - 1 was running
    assert len(h.plans) == n and h.ahead_counts() == (3, 1), "three steps went ahead, the one after the arrival not"
    h.step()
    assert [rid for rid, *_ in h.plans[n]] == [1, 2], "planned into the very next step"
    h.run()
    assert h.outputs(1) == expect(h, [5, 6, 7], greedy(12, ignore_eos=True))
    assert h.outputs(2) == expect(h, [8, 9], greedy(4, ignore_eos=True))


def test_an_abort_during_a_forward_stops_launching_ahead_and_lands_last(make):
    h = make(team=2, defer_publish=True, launch_ahead=True)
    h.submit(1, [5, 6, 7], greedy(30, ignore_eos=True))
    h.submit(2, [4], greedy(30, ignore_eos=True))
    state = {"forwards": 0}

    def maybe_abort():
        state["forwards"] += 1
        if state["forwards"] == 5:
            h.abort(1)

    h.step()  # the prefill
    h.during_forward = maybe_abort
    h.step()  # goes ahead until the abort arrives, then completes the step as before
    h.during_forward = None
    assert len(h.plans) == 6 and h.ahead_counts() == (4, 1)
    h.step()  # the gap: the last step's records, then the abort
    tokens, reason = h.outputs(1)
    assert reason == FinishReason.ABORT and tokens == expect(h, [5, 6, 7], greedy(30, ignore_eos=True))[0][:6]
    h.run()
    assert h.outputs(2) == expect(h, [4], greedy(30, ignore_eos=True))


def test_no_inputs_ahead_when_the_kv_pool_cannot_hold_the_next_step(make):
    """Two requests crossing into a new block with one block free: the synchronous path preempts."""
    h = make(max_num_seqs=2, max_num_batched_tokens=8, block_size=4, num_blocks=5, max_model_len=40, eos=(),
             team=2, defer_publish=True, launch_ahead=True)
    for rid in (1, 2):
        h.submit(rid, [rid + 3] * 4, greedy(12))
    h.run()
    assert h.info()["preemptions"] > 0
    for rid in (1, 2):
        assert h.outputs(rid) == expect(h, [rid + 3] * 4, greedy(12))


def test_a_queue_behind_a_full_batch_does_not_stop_launching_ahead(make):
    """Two sequence slots and four requests: while two decode, the two waiting cannot be admitted (schedule()'s
    admission loop does not start), so those steps go ahead; a step that can admit is planned the synchronous way.
    The same plans and records as without launching ahead."""
    reqs = [(rid, [rid + 2] * 3, greedy(10 + rid, ignore_eos=True)) for rid in range(1, 5)]
    runs = {}
    for ahead in (False, True):
        h = make(max_num_seqs=2, max_num_batched_tokens=16, team=2, defer_publish=True, launch_ahead=ahead)
        for req in reqs:
            h.submit(*req)
        h.run()
        runs[ahead] = h
    h = runs[True]
    assert h.plans == runs[False].plans and records(h) == records(runs[False])
    for rid, prompt, params in reqs:
        assert h.outputs(rid) == expect(h, prompt, params)
    launched, missed = h.ahead_counts()
    # decodes of (1, 2) then (3, 2) then (3, 4): each pair's steady steps go ahead though requests wait behind them
    assert launched >= 15 and missed == 0, (launched, missed)
