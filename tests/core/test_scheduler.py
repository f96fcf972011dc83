"""Host scheduler: FCFS admission, decodes first, chunked prefill under the budget, preemption by recompute."""
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.core.outputs import SampledToken
from blink.core.scheduler import Scheduler
from blink.core.sequence import SeqStatus, Sequence
from blink.request import SamplingParams


def seq(i, n_prompt, max_tokens=8):
    return Sequence(i, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens), seed=i, arrival=i)


def run_step(s: Scheduler, token=7):
    """Schedule, pretend the forward ran and sampled `token` for every sequence that samples, apply it."""
    plan = s.schedule()
    events = s.update_from_output(plan, [SampledToken(token, 0.0, [], []) if c.samples else None
                                         for c in plan.chunks])
    assert [e.req_id for e in events] == [c.seq.req_id for c in plan.chunks if c.samples]
    return plan


def test_chunked_prefill_respects_budget_and_decodes_go_first():
    s = Scheduler(num_blocks=100, block_size=4, max_num_seqs=8, max_num_batched_tokens=10)
    a, b = seq(1, 3), seq(2, 25)
    s.add(a)
    s.add(b)
    plan = run_step(s)
    assert [(c.seq.req_id, c.start, c.num_tokens) for c in plan.chunks] == [(1, 0, 3), (2, 0, 7)]
    assert not plan.chunks[1].samples and plan.chunks[0].samples
    plan = run_step(s)
    # a now decodes (1 token) and comes first; b continues its prompt with the rest of the budget
    assert [(c.seq.req_id, c.start, c.num_tokens) for c in plan.chunks] == [(1, 3, 1), (2, 7, 9)]
    plan = run_step(s)
    assert [(c.seq.req_id, c.num_tokens) for c in plan.chunks] == [(1, 1), (2, 9)]
    assert plan.chunks[1].samples and b.output_ids == [7]


def test_max_num_seqs_caps_admission_fcfs():
    s = Scheduler(num_blocks=100, block_size=4, max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [seq(i, 2) for i in range(4)]
    for q in seqs:
        s.add(q)
    plan = run_step(s)
    assert [c.seq.req_id for c in plan.chunks] == [0, 1]
    assert [q.req_id for q in s.waiting] == [2, 3]
    assert s.abort(seqs[0].req_id).finish_reason.name == "ABORT"
    plan = run_step(s)
    assert [c.seq.req_id for c in plan.chunks] == [1, 2]


def test_preempts_newest_and_recomputes_later():
    # 4 blocks of 2 tokens; two sequences of 3 prompt tokens take 2 blocks each, then both must grow.
    s = Scheduler(num_blocks=4, block_size=2, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq(1, 3), seq(2, 3)
    s.add(a)
    s.add(b)
    run_step(s)
    assert s.blocks.num_free == 0
    plan = run_step(s)  # a decodes token 4 (fits block 2), b too
    assert len(plan.chunks) == 2
    plan = run_step(s)  # both need a 3rd block: b (newest) is preempted, a continues
    assert [c.seq.req_id for c in plan.chunks] == [1]
    assert b.status == SeqStatus.WAITING and b.num_computed == 0 and b.block_ids == []
    assert s.num_preemptions == 1 and s.waiting[0] is b
    assert b.output_ids == [7, 7]  # generated tokens are kept and recomputed as part of the prefix
    s.abort(a.req_id)
    plan = run_step(s)
    assert [(c.seq.req_id, c.start, c.num_tokens) for c in plan.chunks] == [(2, 0, 5)]
    assert plan.chunks[0].samples


def test_preempting_a_sequence_already_scheduled_this_step_returns_its_chunk():
    s = Scheduler(num_blocks=3, block_size=2, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq(1, 4), seq(2, 1)
    s.add(a)
    s.add(b)
    s.token_budget = 2  # a gets a partial prefill, b waits for budget
    run_step(s)
    s.token_budget = 64
    run_step(s)  # a completes its prompt, b is admitted with 1 block
    assert b.status == SeqStatus.RUNNING and a.output_ids == [7]
    plan = s.schedule()  # b decodes first (block ok), a needs a 3rd block -> b preempted, its chunk removed
    ids = [c.seq.req_id for c in plan.chunks]
    assert ids.count(2) == 0 and b.status == SeqStatus.WAITING


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 6)), min_size=1, max_size=12),
       st.integers(6, 30), st.integers(1, 4), st.integers(2, 24))
def test_random_workloads_finish_without_leaking_blocks(reqs, num_blocks, max_seqs, budget):
    s = Scheduler(num_blocks=num_blocks, block_size=2, max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    seqs = []
    for i, (n, m) in enumerate(reqs):
        if -(-(n + m) // 2) > num_blocks:
            continue  # the engine refuses requests that could never fit the pool
        seqs.append(seq(i, n, max_tokens=m))
        s.add(seqs[-1])
    for _ in range(2000):
        if not s.has_unfinished():
            break
        plan = run_step(s)
        owned = [b for q in s.running for b in q.block_ids]
        assert len(owned) == len(set(owned)) and len(owned) + s.blocks.num_free == num_blocks
        assert sum(c.num_tokens for c in plan.chunks) <= s.token_budget
    assert not s.has_unfinished() and not s.requests
    assert s.blocks.num_free == num_blocks
    assert all(len(q.output_ids) == q.params.max_tokens for q in seqs)


def test_update_from_output_finishes_on_stop_tokens_and_length():
    s = Scheduler(num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=8,
                  eos_token_ids=(2,))
    a = Sequence(1, [5, 6], SamplingParams(max_tokens=4, min_tokens=1), seed=1, arrival=1)
    b = Sequence(2, [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=50), seed=2, arrival=2)
    s.add(a)
    s.add(b)
    plan = s.schedule()
    events = s.update_from_output(plan, [SampledToken(2, -0.5, [], []), SampledToken(3, -1.0, [], [])])
    assert [(e.req_id, e.finish_reason.name) for e in events] == [(1, "NONE"), (2, "NONE")]  # EOS < min_tokens
    plan = s.schedule()
    events = s.update_from_output(plan, [SampledToken(2, 0.0, [], []), SampledToken(4, 0.0, [], [])])
    # a: EOS after min_tokens; b: 8 tokens reach max_model_len
    assert [(e.req_id, e.position, e.finish_reason.name) for e in events] == [(1, 1, "STOP"), (2, 1, "LENGTH")]
    assert not s.has_unfinished() and s.blocks.num_free == 10 and s.abort(1) is None
