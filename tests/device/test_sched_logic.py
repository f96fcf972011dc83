"""The scheduler's decision logic (csrc/sched*.h) built for the host and driven on the CPU: admission,
chunking, preemption by recompute, frees, ring and arena wrap-around, stops, aborts, refusals."""
from __future__ import annotations

import random

import numpy as np
import pytest

from blink.device import structs
from blink.request import FinishReason, SamplingParams
from tests.device.harness import HostScheduler, reference, slow_reader

pytestmark = pytest.mark.timeout(120)
# (team, defer_publish, launch_ahead): defer_publish runs the GPU loop's order (records after the next launch,
# arrivals ingested during the forward, aborts held until then: tests/device/test_sched_during_forward.py), and
# launch_ahead its next step launched ahead when nothing changed (tests/device/test_sched_ahead.py)
GPU_ORDER = [(1, False, False), (4, False, False), (4, True, False), (4, True, True)]


def greedy(max_tokens=8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def expect(h: HostScheduler, prompt, params):
    c = h.cfg
    return reference(prompt, params, c.vocab_size, c.eos, c.max_model_len)


def assert_idle_and_clean(h: HostScheduler):
    i = h.info()
    assert (i["running"], i["waiting"]) == (0, 0)
    assert i["free_blocks"] == h.cfg.num_blocks and i["free_slots"] == h.cfg.max_num_seqs
    assert i["free_entries"] == h.cfg.max_requests


def test_one_request_matches_the_reference(make):
    h = make()
    prompt, params = [5, 6, 7], greedy(10, ignore_eos=True)
    h.submit(1, prompt, params)
    h.run()
    assert h.outputs(1) == expect(h, prompt, params)
    assert h.outputs(1)[1] == FinishReason.LENGTH
    assert h.events[1][0].logprob == pytest.approx(-0.25)
    assert_idle_and_clean(h)


@pytest.mark.parametrize("team", [1, 3, 8])
def test_mixed_workload_with_preemption_matches_the_host_scheduler(make, team):
    """Staggered arrivals into a KV pool far too small: every request still yields the reference tokens,
    and every step is the one blink.core.scheduler.Scheduler (host mode) would have planned. With
    team=3, three host threads run the team code as a CTA's threads do on the GPU."""
    from blink.core.outputs import SampledToken
    from blink.core.scheduler import Scheduler
    from blink.core.sequence import Sequence

    h = make(max_num_seqs=6, max_num_batched_tokens=16, num_blocks=24, max_requests=12, max_model_len=48,
             eos=(), team=team)
    host = Scheduler(24, 4, 6, 16, max_model_len=48, eos_token_ids=())
    seqs: dict[int, Sequence] = {}
    rng = random.Random(0)
    reqs = []
    for rid in range(1, 151):
        prompt = [rng.randrange(2, 50) for _ in range(rng.randrange(1, 30))]
        reqs.append((rid, prompt, greedy(rng.randrange(1, 48 - len(prompt)))))
    pending = list(reqs)
    steps = 0
    while pending or h.busy():
        for _ in range(rng.randrange(0, 3)):
            if pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2:
                rid, prompt, params = pending.pop(0)
                h.submit(rid, prompt, params)
                seqs[rid] = Sequence(rid, prompt, params, 0, rid)
                host.add(seqs[rid])
        plan = host.schedule()
        rows = h.step()
        steps += 1
        assert rows == len(plan.chunks)
        if rows:
            assert h.plans[-1] == [(c.seq.req_id, c.start, c.num_tokens, c.samples) for c in plan.chunks]
            # The C++ scheduler's tokens, applied by the Python one: both must agree on every finish.
            device_events = [h.events[c.seq.req_id][-1] if c.samples else None for c in plan.chunks]
            sampled = [SampledToken(ev.token_id, 0.0, [], []) if ev else None for ev in device_events]
            host_events = host.update_from_output(plan, sampled)
            assert [(e.req_id, e.token_id, e.position, e.finish_reason) for e in host_events] == \
                [(e.req_id, e.token_id, e.position, e.finish_reason) for e in device_events if e]
        assert steps < 5000
    for rid, prompt, params in reqs:
        assert h.outputs(rid) == expect(h, prompt, params), rid
    assert h.info()["preemptions"] > 0 and host.num_preemptions == h.info()["preemptions"]
    assert 0 < h.info()["fast_plans"] < steps, "both the parallel decode plan and the leader's plan ran"
    assert_idle_and_clean(h)


@pytest.mark.parametrize("team", [1, 4])
def test_chunked_prefill_respects_the_budget_and_decodes_go_first(make, team):
    h = make(max_num_batched_tokens=8, max_model_len=64, num_blocks=64, team=team)
    h.submit(1, [3] * 3, greedy(6, ignore_eos=True))
    h.step()  # request 1 prefilled in one chunk; now decoding
    h.submit(2, list(range(2, 32)), greedy(2, ignore_eos=True))  # 30 tokens: 4 chunks under budget 8
    h.run()
    for plan in h.plans:
        assert sum(n for _, _, n, _ in plan) <= 8
    mixed = [p for p in h.plans if {r for r, *_ in p} == {1, 2}]
    assert mixed and all(p[0][0] == 1 and p[0][2] == 1 for p in mixed), "the decode leads every mixed step"
    chunks = [(start, n, samples) for p in h.plans for r, start, n, samples in p if r == 2]
    assert chunks[:4] == [(0, 7, False), (7, 7, False), (14, 7, False), (21, 7, False)]
    assert h.outputs(2) == expect(h, list(range(2, 32)), greedy(2, ignore_eos=True))


@pytest.mark.parametrize("team", [1, 4])
def test_stop_conditions(make, team):
    h = make(eos=(1,), max_model_len=24, vocab_size=50, team=team)
    rng = random.Random(3)
    cases = {}
    rid = 0
    for params in [greedy(20), greedy(20, ignore_eos=True), greedy(20, min_tokens=5),
                   greedy(20, stop_token_ids=[7, 11, 13, 17, 19, 23, 29, 31]), greedy(3)]:
        for _ in range(6):
            rid += 1
            prompt = [rng.randrange(2, 50) for _ in range(rng.randrange(1, 12))]
            cases[rid] = (prompt, params)
    for rid, (prompt, params) in cases.items():
        if h.producer.descriptors.free() == 0 or h.info()["free_entries"] == 0:
            h.run()
        h.submit(rid, prompt, params)
    h.run()
    reasons = set()
    for rid, (prompt, params) in cases.items():
        assert h.outputs(rid) == expect(h, prompt, params), rid
        reasons.add(h.outputs(rid)[1])
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH}
    # max_model_len caps a request whose max_tokens would run past it
    long_prompt, params = [4] * 20, greedy(16, ignore_eos=True)
    h.submit(999, long_prompt, params)
    h.run()
    assert h.outputs(999) == (expect(h, long_prompt, params)[0], FinishReason.LENGTH)
    assert len(h.outputs(999)[0]) == 4
    assert_idle_and_clean(h)


@pytest.mark.parametrize(("team", "defer_publish", "launch_ahead"), GPU_ORDER)
def test_aborts_at_every_stage(make, team, defer_publish, launch_ahead):
    h = make(max_num_seqs=2, max_num_batched_tokens=4, max_model_len=64, num_blocks=32, team=team,
             defer_publish=defer_publish, launch_ahead=launch_ahead)
    p = greedy(30, ignore_eos=True)
    h.submit(1, [2] * 3, p)       # will be running (decoding)
    h.submit(2, [3] * 20, p)      # will be mid-prefill (20 tokens, budget 4)
    h.submit(3, [4] * 3, p)       # waiting: no slot
    for _ in range(3):
        h.step()
    assert h.info()["running"] == 2 and h.info()["waiting"] == 1
    for rid in (3, 2, 1):
        h.abort(rid)
    h.abort(77)                   # unknown id: ignored
    h.submit(4, [5] * 3, p)
    h.abort(4)                    # aborted in the same ingest round it arrived
    h.step()
    for rid in (1, 2, 3, 4):
        evs = h.events[rid]
        assert evs[-1].finish_reason == FinishReason.ABORT and evs[-1].token_id == -1
        assert evs[-1].position == len(evs) - 1
        h.outputs(rid)
    assert len(h.events[3]) == len(h.events[2]) == len(h.events[4]) == 1
    assert 77 not in h.events
    h.abort(1)  # already finished: no second record
    h.step()
    assert len([e for e in h.events[1] if e.finished]) == 1
    assert_idle_and_clean(h)


def test_invalid_descriptors_are_refused_and_the_engine_stays_up(make):
    h = make(max_model_len=16, vocab_size=50, num_blocks=3, block_size=4)
    h.submit(1, [2] * 16, greedy(1))          # no room for output
    h.submit(2, [2, 99, 3], greedy(4))        # token id out of range
    h.submit(3, [2] * 5, greedy(10))          # needs 4 blocks, pool has 3
    h.submit(4, [], greedy(4))                # empty prompt
    # a descriptor of an unknown kind, written raw
    rec = np.zeros(1, h.producer.descriptors.records.dtype)
    rec["kind"], rec["req_id"] = 9, 5
    h.producer._publish(rec)
    h.submit(6, [2, 3], greedy(3, ignore_eos=True))
    h.run()
    for rid in (1, 2, 3, 4, 5):
        assert [(e.token_id, e.finish_reason) for e in h.events[rid]] == [(-1, FinishReason.ERROR)], rid
    assert h.info()["error_code"] == structs.ERR_INVALID_DESCRIPTOR
    assert h.seg.control.error_code == structs.ERR_INVALID_DESCRIPTOR
    assert h.outputs(6) == expect(h, [2, 3], greedy(3, ignore_eos=True))
    assert_idle_and_clean(h)


@pytest.mark.parametrize("team", [1, 3])
def test_ring_and_arena_wrap_around_with_a_full_request_table(make, team):
    h = make(ingress_capacity=3, arena_capacity=40, max_requests=3, max_num_seqs=2, egress_capacity=64, team=team)
    rng = random.Random(5)
    reqs = {rid: ([rng.randrange(2, 50) for _ in range(rng.randrange(1, 13))],
                  greedy(rng.randrange(1, 6), logit_bias={3: 1.0} if rid % 3 == 0 else {}))
            for rid in range(1, 31)}
    queue = list(reqs)
    while queue or h.busy():
        while queue and h.producer.submit(queue[0], *reqs[queue[0]], timeout=0):
            queue.pop(0)
        h.step()
    assert int(h.producer.arena.tail) > 3 * 40  # wrapped several times
    for rid, (prompt, params) in reqs.items():
        assert h.outputs(rid) == expect(h, prompt, params), rid
    assert_idle_and_clean(h)


@pytest.mark.parametrize(("team", "defer_publish", "launch_ahead"), GPU_ORDER)
def test_egress_backpressure_loses_nothing(make, team, defer_publish, launch_ahead):
    """An egress ring of 2 records and a slow reader: the scheduler waits, nothing is lost or reordered."""
    h = make(egress_capacity=2, max_num_seqs=4, team=team, defer_publish=defer_publish, launch_ahead=launch_ahead)
    reqs = {rid: ([rid + 2] * 3, greedy(5, ignore_eos=True)) for rid in range(1, 9)}
    for rid, (prompt, params) in reqs.items():
        h.submit(rid, prompt, params)
    with slow_reader(h, 0.0005, expect_events=40) as got:
        while h.busy():
            h.step()
        h.step()  # idle: with defer_publish, the last step's records go out here
    for ev in got:
        h.events.setdefault(ev.req_id, []).append(ev)
    for rid, (prompt, params) in reqs.items():
        assert h.outputs(rid) == expect(h, prompt, params)


@pytest.mark.parametrize("team", [1, 4])
def test_admission_writes_the_sampling_slot_and_rebuilds_counts_after_preemption(make, team):
    h = make(max_num_seqs=2, max_num_batched_tokens=8, num_blocks=6, block_size=4, max_model_len=24, eos=(),
             team=team)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
                            frequency_penalty=0.25, repetition_penalty=1.5, seed=1234, max_tokens=12,
                            logit_bias={4: 2.5, 9: -1.0})
    h.submit(2, [5, 6, 7, 8, 9], greedy(12))
    h.submit(1, [2, 3, 4], params)  # the newest: the one preempted
    seen_preemption, counts_checked = False, 0
    while h.busy():
        h.step()
        seen_preemption |= h.info()["preemptions"] > 0
        for slot in range(2):
            if not h.sampling["flags"][slot] & 1:
                continue
            s = h.sampling
            assert s["temperature"][slot] == pytest.approx(0.7) and s["top_k"][slot] == 5
            assert s["seed"][slot] == 1234 and s["repetition_penalty"][slot] == pytest.approx(1.5)
            assert s["flags"][slot] == 3
            assert list(s["bias_ids"][slot, :3]) == [4, 9, -1] and list(s["bias_vals"][slot, :2]) == [2.5, -1.0]
            assert list(np.nonzero(s["prompt_mask"][slot])[0]) == [2, 3, 4]
            generated = [e.token_id for e in h.events.get(1, []) if e.token_id >= 0]
            if h.info()["running"] and 1 in {r for r, *_ in h.plans[-1]} and not h.events[1][-1].finished:
                assert (s["output_counts"][slot] == np.bincount(generated, minlength=50)).all()
                counts_checked += 1
    assert seen_preemption and counts_checked > 3
    recomputed = [p for p in h.plans for r, start, n, _ in p if r == 1 and start == 0 and n > 3]
    assert recomputed, "request 1 was re-admitted with its generated tokens (recompute)"
    assert h.outputs(1) == expect(h, [2, 3, 4], params)
    assert h.outputs(2) == expect(h, [5, 6, 7, 8, 9], greedy(12))


@pytest.mark.parametrize(("team", "defer_publish", "launch_ahead"), GPU_ORDER)
def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(make, team, defer_publish, launch_ahead):
    """With defer_publish the first step's tokens are still pending when the launch fails: they go out first."""
    h = make(team=team, defer_publish=defer_publish, launch_ahead=launch_ahead)
    h.submit(1, [2, 3], greedy(5, ignore_eos=True))
    h.submit(2, [4, 5], greedy(5, ignore_eos=True))
    h.step()
    h.fail_next = True
    h.step()
    for rid in (1, 2):
        assert h.events[rid][-1].finish_reason == FinishReason.ERROR and h.events[rid][-1].token_id == -1
        assert h.outputs(rid)[0] == expect(h, [2, 3] if rid == 1 else [4, 5], greedy(5, ignore_eos=True))[0][:1]
    assert h.info()["error_code"] == structs.ERR_LAUNCH_BASE + 1
    h.submit(3, [6], greedy(3, ignore_eos=True))
    h.run()
    assert h.outputs(3) == expect(h, [6], greedy(3, ignore_eos=True))
    assert_idle_and_clean(h)


def test_one_step_ingests_several_staging_rounds_in_ring_order(make):
    h = make(ingress_capacity=200, arena_capacity=2048, max_requests=200, egress_capacity=1024)
    for rid in range(1, 151):
        h.submit(rid, [rid % 40 + 2], greedy(1))
    h.step()
    i = h.info()
    assert i["running"] + i["waiting"] + len(h.events) == 150  # three rounds of 64 descriptors, one step
    assert [r for r, *_ in h.plans[0]] == [1, 2, 3, 4]  # FCFS
    h.run()
    assert sorted(h.events) == list(range(1, 151))
    assert_idle_and_clean(h)
