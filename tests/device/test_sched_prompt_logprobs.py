"""Prompt logprobs in the C++ scheduler (csrc/sched_plan.h's row cap and input rows, sched_finish.h's prompt
records), built for the host and driven through real rings: every step is the one the Python scheduler
plans, with prefix caching, preemption and aborts; every prompt record equals the host's prompt event."""
from __future__ import annotations

import random

import numpy as np
import pytest

from blink.core.outputs import PromptLogprob, SampledToken
from blink.core.scheduler import Scheduler
from blink.core.sequence import Sequence
from blink.request import FinishReason, SamplingParams
from tests.device.harness import fake_prompt_entry, reference

pytestmark = pytest.mark.timeout(180)
ROWS = 5  # prompt-logprob rows per step


def key(e, k=None):
    k = len(e.top_ids) if k is None else k
    return (e.req_id, e.token_id, e.position, e.finish_reason, float(np.float32(e.logprob)), e.rank,
            list(e.top_ids[:k]), [float(np.float32(x)) for x in e.top_logprobs[:k]])


def host_prompt_logprobs(plan, vocab: int) -> list[list[PromptLogprob]]:
    """What the harness's fake prompt-logprob kernel gives for each chunk's rows (fake_prompt_entry)."""
    out = []
    for c in plan.chunks:
        seq, entries = c.seq, []
        for j in range(c.num_prompt_rows):
            p = c.start + j
            lp, rank, tops = fake_prompt_entry(seq.token_at(p), p, seq.prompt_ids[p + 1], vocab)
            k = seq.params.prompt_logprobs
            entries.append(PromptLogprob(p + 1, seq.prompt_ids[p + 1], lp, rank, tops[:k].tolist(),
                                         (-np.arange(k) - 0.5).tolist()))
        out.append(entries)
    return out


@pytest.mark.parametrize("team", [1, 4])
def test_prompt_logprobs_match_the_host_scheduler(make, team):
    h = make(max_num_seqs=6, max_num_batched_tokens=16, num_blocks=28, max_requests=12, max_model_len=48,
             eos=(), team=team, prefix_caching=True, prompt_logprob_rows=ROWS)
    host = Scheduler(28, 4, 6, 16, max_model_len=48, eos_token_ids=(), enable_prefix_caching=True,
                     prompt_logprob_rows=ROWS)
    log = []
    poll = h.consumer.poll
    h.consumer.poll = lambda *a: (lambda got: log.extend(got) or got)(poll(*a))
    rng = random.Random(3)
    prefixes = [[rng.randrange(2, 50) for _ in range(n)] for n in (8, 13)]
    reqs, aborted, pending, steps = [], set(), [], 0
    for rid in range(1, 121):
        prompt = (rng.choice(prefixes) + [rng.randrange(2, 50) for _ in range(rng.randrange(0, 14))])[:30]
        plp = rng.choice([None, None, 0, 2, 3])
        reqs.append((rid, prompt, SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 48 - len(prompt)),
                                                 prompt_logprobs=plp)))
    pending = list(reqs)
    while pending or h.busy():
        for _ in range(rng.randrange(0, 3)):
            if pending and h.producer.descriptors.free() and h.info()["free_entries"] > 2:
                rid, prompt, params = pending.pop(0)
                h.submit(rid, prompt, params)
                host.add(Sequence(rid, prompt, params, 0, rid))
        if steps % 17 == 9 and host.running:
            victim = rng.choice(host.running).req_id
            h.abort(victim)
            host.abort(victim)
            aborted.add(victim)
        plan = host.schedule()
        start = len(log)
        rows = h.step()
        assert rows == len(plan.chunks)
        steps += 1
        assert steps < 8000
        if not rows:
            continue
        assert h.plans[-1] == [(c.seq.req_id, c.start, c.num_tokens, c.samples) for c in plan.chunks]
        assert sum(c.num_prompt_rows for c in plan.chunks) <= ROWS
        device = [e for e in log[start:] if e.finish_reason != FinishReason.ABORT]
        tokens = {e.req_id: e for e in device if not e.is_prompt}
        sampled = [SampledToken(tokens[c.seq.req_id].token_id, 0.0, [], []) if c.samples else None
                   for c in plan.chunks]
        plan.prompt_logprobs = host_prompt_logprobs(plan, h.cfg.vocab_size)
        host_events = host.update_from_output(plan, sampled)
        assert [key(e) for e in device if e.is_prompt] == [key(e) for e in host_events if e.is_prompt]
        assert [key(e, 0)[:4] for e in device if not e.is_prompt] == [key(e, 0)[:4] for e in host_events
                                                                     if not e.is_prompt]
    c = h.cfg
    asked = 0
    for rid, prompt, params in reqs:
        evs = h.events[rid]
        if rid in aborted:
            assert evs[-1].finish_reason == FinishReason.ABORT
            continue
        gen = [e for e in evs if not e.is_prompt]
        assert [e.token_id for e in gen if e.token_id >= 0] == reference(prompt, params, c.vocab_size, c.eos,
                                                                          c.max_model_len)[0]
        plps = [e for e in evs if e.is_prompt]
        if params.prompt_logprobs is None:
            assert plps == []
            continue
        asked += 1
        first_token = next(i for i, e in enumerate(evs) if not e.is_prompt)
        assert all(e.is_prompt for e in evs[:first_token]) and not any(e.is_prompt for e in evs[first_token:])
        assert sorted({-e.position for e in plps}) == list(range(1, len(prompt)))  # (a recompute resends)
        for e in plps:
            i = -e.position
            lp, rank, tops = fake_prompt_entry(prompt[i - 1], i - 1, prompt[i], c.vocab_size)
            assert (e.token_id, e.rank, e.top_ids) == (prompt[i], rank, tops[:params.prompt_logprobs].tolist())
            assert e.logprob == pytest.approx(lp, abs=1e-6)
    assert asked > 30
    i = h.info()
    assert i["preemptions"] == host.num_preemptions > 0
    assert i["prefix_hits"] > 0  # requests without prompt logprobs still share prefixes
    assert (i["prefix_queries"], i["prefix_hits"]) == (host.prefix_cache.queries, host.prefix_cache.hits)
    assert i["free_blocks"] == c.num_blocks and i["running"] == 0


def test_an_engine_without_rows_refuses_prompt_logprobs(make):
    h = make()  # prompt_logprob_rows = 0
    h.submit(1, [5, 6, 7], SamplingParams(max_tokens=2, prompt_logprobs=1))
    h.submit(2, [5, 6, 7], SamplingParams(max_tokens=2))
    h.run()
    assert [e.finish_reason for e in h.events[1]] == [FinishReason.ERROR]
    assert h.outputs(2)[1] == FinishReason.LENGTH
