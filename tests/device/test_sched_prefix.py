"""Prefix caching in the C++ scheduler (csrc/sched_prefix.h, sched_blocks.h), built for the host and driven
through real rings: every step is the one the Python scheduler (blink/core/prefix_cache.py) plans, the
fake model's tokens (read back through the shared blocks) equal the reference, cached_tokens and the
counters agree, and the reset command forgets every block."""
from __future__ import annotations

import random

import pytest

from blink.core.outputs import SampledToken
from blink.core.scheduler import Scheduler
from blink.core.sequence import Sequence
from blink.request import FinishReason, SamplingParams
from tests.device.harness import HostScheduler, reference

pytestmark = pytest.mark.timeout(180)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


def lockstep(h: HostScheduler, host: Scheduler, seqs: dict[int, Sequence]) -> None:
    """One step on both; their plans, tokens, finishes and cached_tokens must agree."""
    plan = host.schedule()
    rows = h.step()
    assert rows == len(plan.chunks)
    if not rows:
        return
    assert h.plans[-1] == [(c.seq.req_id, c.start, c.num_tokens, c.samples) for c in plan.chunks]
    device_events = [h.events[c.seq.req_id][-1] if c.samples else None for c in plan.chunks]
    sampled = [SampledToken(ev.token_id, 0.0, [], []) if ev else None for ev in device_events]
    host_events = host.update_from_output(plan, sampled)
    key = [(e.req_id, e.token_id, e.position, e.finish_reason, e.cached_tokens) for e in host_events]
    assert key == [(e.req_id, e.token_id, e.position, e.finish_reason, e.cached_tokens) for e in device_events if e]


def assert_same_pool(h: HostScheduler, host: Scheduler) -> None:
    i = h.info()
    assert i["free_blocks"] == host.blocks.num_free and i["cached_free_blocks"] == len(host.blocks.lru)
    pc = host.prefix_cache
    assert (i["prefix_queries"], i["prefix_hits"]) == (pc.queries, pc.hits)


@pytest.mark.parametrize("team", [1, 4])
def test_shared_prefixes_with_aborts_preemption_and_eviction_match_the_host_scheduler(make, team):
    """200+ requests over a few shared prefixes (ending mid-block, on a boundary, whole prompts resent,
    multi-turn follow-ups) in a pool small enough to preempt and evict, with random aborts."""
    h = make(max_num_seqs=6, max_num_batched_tokens=16, num_blocks=28, max_requests=12, max_model_len=48,
             eos=(), team=team, prefix_caching=True)
    host = Scheduler(28, 4, 6, 16, max_model_len=48, eos_token_ids=(), enable_prefix_caching=True)
    rng = random.Random(7)
    prefixes = [[rng.randrange(2, 50) for _ in range(n)] for n in (8, 11, 16, 5)]
    reqs, seqs, aborted = [], {}, set()
    for rid in range(1, 221):
        base = rng.choice(prefixes)
        prompt = (base + [rng.randrange(2, 50) for _ in range(rng.randrange(0, 12))])[:30]
        if rid % 9 == 0 and reqs:  # a follow-up turn: an earlier prompt resent with more after it
            prompt = (reqs[rng.randrange(len(reqs))][1] + [rng.randrange(2, 50)])[:30]
        reqs.append((rid, prompt, greedy(rng.randrange(1, 48 - len(prompt)))))
    pending, steps = list(reqs), 0
    while pending or h.busy():
        for _ in range(rng.randrange(0, 3)):
            if pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2:
                rid, prompt, params = pending.pop(0)
                h.submit(rid, prompt, params)
                seqs[rid] = Sequence(rid, prompt, params, 0, rid)
                host.add(seqs[rid])
        if steps % 13 == 5 and host.running:
            victim = rng.choice(host.running).req_id
            h.abort(victim)
            host.abort(victim)
            aborted.add(victim)
        lockstep(h, host, seqs)
        assert_same_pool(h, host)
        steps += 1
        assert steps < 8000
    c = h.cfg
    for rid, prompt, params in reqs:
        if rid in aborted:
            assert h.events[rid][-1].finish_reason == FinishReason.ABORT
        else:
            assert h.outputs(rid) == reference(prompt, params, c.vocab_size, c.eos, c.max_model_len), rid
    i = h.info()
    assert i["preemptions"] > 0 and i["preemptions"] == host.num_preemptions
    assert i["prefix_hits"] > i["prefix_queries"] // 5, "the shared prefixes should hit often"
    assert 0 < i["cached_free_blocks"] and i["free_blocks"] == c.num_blocks and i["running"] == 0
    assert host.blocks.ref == [0] * c.num_blocks


@pytest.mark.parametrize("team", [1, 4])
def test_a_burst_on_a_long_shared_prefix_takes_the_teams_match(make, team):
    """Waves of requests on one 40-token prefix (10 blocks), several admitted per step: the team's match
    (issue 16) decides them, step for step as the Python scheduler, including the LRU recount when an
    earlier admission of the same step already took the cached blocks out of the LRU."""
    h = make(max_num_seqs=8, max_num_batched_tokens=64, block_size=4, max_model_len=64, num_blocks=160,
             max_requests=16, eos=(), team=team, prefix_caching=True, ingress_capacity=32)
    host = Scheduler(160, 4, 8, 64, max_model_len=64, eos_token_ids=(), enable_prefix_caching=True)
    rng = random.Random(11)
    prefix = [rng.randrange(2, 50) for _ in range(40)]
    seqs, rid = {}, 0
    for wave in range(4):
        for _ in range(6 if wave else 1):  # the first wave fills the cache, then bursts hit it (LRU, in use)
            rid += 1
            prompt = prefix + [rng.randrange(2, 50) for _ in range(rng.randrange(1, 9))]
            params = greedy(rng.randrange(1, 8))
            h.submit(rid, prompt, params)
            seqs[rid] = Sequence(rid, prompt, params, 0, rid)
            host.add(seqs[rid])
        while h.busy():
            lockstep(h, host, seqs)
            assert_same_pool(h, host)
    c = h.cfg
    for r, seq in seqs.items():
        assert h.outputs(r) == reference(seq.prompt_ids, seq.params, c.vocab_size, c.eos, c.max_model_len), r
        assert h.events[r][-1].cached_tokens == (40 if r > 1 else 0), r
    i = h.info()
    assert i["team_matches"] == 19, "every admission takes the team's match (no eviction in this pool)"
    # Per burst of 6: the first takes the 10 blocks out of the LRU itself, the other 5 find them held.
    assert i["team_shares"] == 15


@pytest.mark.parametrize("team", [1, 4])
def test_an_eviction_earlier_in_the_plan_shortens_the_teams_match(make, team):
    """The team matched 4 cached blocks for the second request of a plan, but the first request's blocks
    evict the last of them (the LRU's oldest): the hit must end before it, as the Python walk does."""
    h = make(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, max_model_len=64, num_blocks=16,
             max_requests=8, eos=(), team=team, prefix_caching=True)
    host = Scheduler(16, 4, 4, 64, max_model_len=64, eos_token_ids=(), enable_prefix_caching=True)
    seqs = {}

    def submit(rid, prompt):
        seqs[rid] = Sequence(rid, prompt, greedy(1), 0, rid)
        h.submit(rid, prompt, greedy(1))
        host.add(seqs[rid])

    def run():
        while h.busy():
            lockstep(h, host, seqs)
            assert_same_pool(h, host)

    p = list(range(10, 26))  # 4 blocks
    submit(1, p)
    run()
    submit(2, list(range(30, 38)))  # 2 blocks, cached after the prefix's: newer in the LRU
    run()
    assert h.info()["cached_free_blocks"] == 6
    submit(3, [(30 + i) % 48 + 2 for i in range(44)])  # 11 blocks: the 10 on the stack, then the LRU's oldest
    submit(4, p + [5])
    run()
    assert h.events[3][-1].cached_tokens == 0 and h.events[4][-1].cached_tokens == 12
    assert seqs[4].num_cached_tokens == 12
    assert h.info()["team_matches"] == 4


def test_cached_tokens_and_reset_command(make):
    h = make(num_blocks=32, block_size=4, prefix_caching=True)
    host = Scheduler(32, 4, 4, 16, max_model_len=64, eos_token_ids=(1,), enable_prefix_caching=True)
    seqs: dict[int, Sequence] = {}

    def run(rid, prompt):
        h.submit(rid, prompt, greedy(3))
        seqs[rid] = Sequence(rid, prompt, greedy(3), 0, rid)
        host.add(seqs[rid])
        while h.busy():
            lockstep(h, host, seqs)
        return h.events[rid][-1].cached_tokens

    base = list(range(10, 22))
    assert run(1, base) == 0
    assert run(2, base[:6] + [3]) == 4  # mid-block
    assert run(3, base[:8] + [3, 4]) == 8  # on a boundary
    assert run(4, base[:8]) == 4  # the whole prompt: its last block recomputed
    ctl = h.seg.control
    ctl.reset_prefix_cache += 1
    host.reset_prefix_cache()
    h.step()  # the idle step applies it
    assert h.info()["resets_done"] == 1 and h.info()["cached_free_blocks"] == 0
    assert_same_pool(h, host)
    assert run(5, base) == 0
    assert run(6, base) == 8
    assert_same_pool(h, host)


def test_cache_off_reports_zero_and_keeps_nothing(make):
    h = make(num_blocks=32)
    for rid in (1, 2):
        h.submit(rid, list(range(10, 22)), greedy(2))
        h.run()
        assert h.events[rid][-1].cached_tokens == 0
    i = h.info()
    assert (i["cached_free_blocks"], i["prefix_queries"], i["prefix_hits"]) == (0, 0, 0)


def test_the_block_key_is_the_python_one():
    """One key function in both modes, so even a true collision is decided alike."""
    import numpy as np

    from blink.core.prefix_cache import block_hash, block_key, content_hash
    from blink.device.build import load_host_library

    lib = load_host_library()
    rng = np.random.default_rng(0)
    parent = 0
    for n in (1, 4, 16, 16, 32):
        tokens = rng.integers(0, 2**31 - 1, size=n, dtype=np.int32)
        want = block_hash(parent, tokens.tolist())
        assert lib.blink_block_hash(parent, tokens.ctypes.data, n) == want
        assert lib.blink_block_key(want) == block_key(want)
        parent = want
    assert len({block_key(block_hash(0, [t])) for t in range(1000)}) == 1000
    # The chain is order-sensitive: the same two blocks swapped give another state.
    a, b = content_hash([1, 2]), content_hash([3, 4])
    assert block_hash(block_hash(0, [1, 2]), [3, 4]) != block_hash(block_hash(0, [3, 4]), [1, 2])
    assert a != b
