"""The scheduler's per-row parallel paths (finish, egress records, the steady-decode plan, step inputs)
run by several host threads as a CTA's threads run them, and what each request asked for in top
logprobs reaching the sampler and its records."""
from __future__ import annotations

import numpy as np
import pytest

from blink.request import MAX_TOP_LOGPROBS, SamplingParams
from tests.device.harness import reference, slow_reader

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("team", "defer_publish"), [(1, False), (4, True)])
def test_top_logprobs_follow_each_requests_logprobs_setting(make, team, defer_publish):
    """logprobs None and 0 -> no tops; k -> exactly the sampler's first k; the slot's num_logprobs is
    written at admission (the sampler computes tops only for slots asking; stale slots start at 5)."""
    h = make(max_num_seqs=4, vocab_size=50, team=team, defer_publish=defer_publish)
    asks = {1: None, 2: 0, 3: 3, 4: MAX_TOP_LOGPROBS}
    for rid, k in asks.items():
        h.submit(rid, [rid + 2, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=k))
    h.step()
    assert sorted(h.sampling["num_logprobs"][:4]) == [0, 0, 3, MAX_TOP_LOGPROBS]
    h.run()
    for rid, k in asks.items():
        evs = h.events[rid]
        assert len(evs) == 4
        for ev in evs:
            n = k or 0
            assert ev.top_ids == [(ev.token_id + j) % 50 for j in range(n)]
            assert ev.top_logprobs == [-float(j) for j in range(n)]


@pytest.mark.parametrize(("team", "defer_publish"), [(1, False), (2, True), (5, True)])
def test_steady_decodes_across_block_boundaries_take_the_parallel_plan(make, team, defer_publish):
    """Eight requests decoding together, blocks of 4, a pool so tight that some steps must fall back to
    the leader's plan (preemption): tokens match the reference and every block has one owner after
    every step (the harness checks), and most steps took the parallel plan."""
    h = make(max_num_seqs=8, max_num_batched_tokens=16, block_size=4, num_blocks=30, max_model_len=40,
             max_requests=16, eos=(), team=team, defer_publish=defer_publish)
    rng = np.random.default_rng(1)
    reqs = {rid: ([int(x) for x in rng.integers(2, 50, size=int(rng.integers(1, 9)))],
                  SamplingParams(temperature=0.0, max_tokens=int(rng.integers(8, 25)), ignore_eos=True))
            for rid in range(1, 13)}
    for rid, (prompt, params) in reqs.items():
        h.submit(rid, prompt, params)
    steps = h.run()
    for rid, (prompt, params) in reqs.items():
        assert h.outputs(rid) == reference(prompt, params, 50, (), 40), rid
    info = h.info()
    assert info["preemptions"] > 0 and steps // 2 < info["fast_plans"] < steps


@pytest.mark.parametrize("team", [3, 6])
def test_a_step_wider_than_the_egress_ring_publishes_in_chunks(make, team):
    """Six sampling rows, an egress ring of 4 records, a reader draining between steps only: each
    step's records go out in chunks, in row order, none lost."""
    h = make(max_num_seqs=6, egress_capacity=4, max_num_batched_tokens=16, team=team)
    reqs = {rid: ([rid + 2], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)) for rid in range(1, 7)}
    for rid, (prompt, params) in reqs.items():
        h.submit(rid, prompt, params)
    with slow_reader(h, 0.0002, expect_events=18) as got:
        h.run()
    assert [ev.req_id for ev in got[:6]] == [1, 2, 3, 4, 5, 6], "row order within a step"
    for ev in got:
        h.events.setdefault(ev.req_id, []).append(ev)
    for rid, (prompt, params) in reqs.items():
        assert h.outputs(rid) == reference(prompt, params, 50, (1,), 64)
