"""Prefix caching in the host scheduler: what an admission shares, what a step indexes, LRU eviction,
reference counts, collisions, reset."""
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.core import prefix_cache
from blink.core.outputs import SampledToken
from blink.core.scheduler import Scheduler
from blink.core.sequence import Sequence
from blink.request import SamplingParams


def sched(num_blocks=64, bs=4, seqs=4, budget=64):
    return Scheduler(num_blocks, bs, seqs, budget, enable_prefix_caching=True)


def seq(i, prompt, max_tokens=2):
    return Sequence(i, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True), seed=i, arrival=i)


def step(s: Scheduler, token=7):
    plan = s.schedule()
    s.update_from_output(plan, [SampledToken(token, 0.0, [], []) if c.samples else None for c in plan.chunks])
    return plan


def run(s: Scheduler, *seqs):
    for q in seqs:
        s.add(q)
    plans = []
    while s.has_unfinished():
        plans.append(step(s))
    return plans


def check_refcounts(s: Scheduler):
    """Every block's count is the number of running sequences holding it; free = stack + LRU."""
    held = [0] * s.blocks.num_blocks
    for q in s.running:
        for b in q.block_ids:
            held[b] += 1
    assert held == s.blocks.ref
    assert set(s.blocks.lru) == {b for b in range(s.blocks.num_blocks) if held[b] == 0 and s.blocks.cached[b]}
    assert s.blocks.num_free == sum(h == 0 for h in held)
    assert set(s.prefix_cache.index.values()) == {b for b in range(s.blocks.num_blocks) if s.blocks.cached[b]}


def test_a_prefix_ending_mid_block_shares_its_full_blocks_only():
    s = sched()
    run(s, seq(1, range(10, 20)))  # 10 tokens: blocks [10..13] [14..17] are full, indexed
    b = seq(2, list(range(10, 16)) + [99, 98, 97])  # shares 6 tokens: one full block
    s.add(b)
    plan = step(s)
    assert (plan.chunks[0].start, plan.chunks[0].num_tokens) == (4, 5)
    assert b.num_cached_tokens == 4 and s.prefix_cache.hits == 4 and s.prefix_cache.queries == 10 + 9


def test_a_prefix_on_a_block_boundary_and_a_whole_prompt():
    s = sched()
    run(s, seq(1, range(10, 18)))  # exactly two blocks
    b, c = seq(2, list(range(10, 18)) + [5]), seq(3, range(10, 18))
    s.add(b)
    s.add(c)
    plan = step(s)
    # b: both blocks cached, only its last token runs; c: the whole prompt is cached, yet its last token
    # is computed (its logits are needed), so it shares one block and recomputes the second.
    assert [(x.seq.req_id, x.start, x.num_tokens) for x in plan.chunks] == [(2, 8, 1), (3, 4, 4)]
    assert (b.num_cached_tokens, c.num_cached_tokens) == (8, 4)
    assert b.block_ids[:2] == c.block_ids[:1] + [b.block_ids[1]] and c.block_ids[1] != b.block_ids[1]
    check_refcounts(s)
    assert s.blocks.ref[b.block_ids[0]] == 2


def test_generated_tokens_are_cached_too_for_the_next_turn():
    s = sched()
    a = seq(1, range(10, 17), max_tokens=6)  # 7 + 6 tokens; the K/V of 12 are computed
    run(s, a)
    b = seq(2, list(range(10, 17)) + a.output_ids + [3, 4])
    run(s, b)
    assert b.num_cached_tokens == 12


def test_eviction_takes_never_cached_blocks_first_then_the_oldest_tail_first():
    s = sched(num_blocks=6, bs=2, seqs=1)
    a = seq(1, range(10, 15), max_tokens=1)  # 5 tokens: 3 blocks, 2 full ones indexed
    run(s, a)
    assert len(s.blocks.lru) == 2 and s.blocks.num_free == 6
    second, first = list(s.blocks.lru)  # the tail block is the older: evicted first
    c = seq(2, range(50, 59), max_tokens=2)  # 9 tokens: 5 blocks, 4 from the stack, then 1 evicted
    s.add(c)
    step(s)
    assert second in c.block_ids and first not in c.block_ids and list(s.blocks.lru) == [first]
    run(s)
    d = seq(3, range(10, 15))
    run(s, d)
    assert d.num_cached_tokens == 2, "the first block survived the eviction, its child did not"


def test_a_hash_collision_never_shares_a_wrong_block(monkeypatch):
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 0)  # every key collides
    s = sched()
    run(s, seq(1, range(10, 22)))
    b, c = seq(2, range(30, 42)), seq(3, range(10, 22))
    run(s, b)
    run(s, c)
    assert b.num_cached_tokens == 0, "other tokens under the same key: a miss"
    assert c.num_cached_tokens == 4, "only the first block got the key; the second stayed private"


def test_a_parent_evicted_and_reused_never_matches_its_old_children(monkeypatch):
    # Keys from a block's own tokens only, so only the parent check can tell the prefixes apart.
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: hash(tuple(tokens)))
    s = sched(num_blocks=3, bs=2, seqs=1)
    run(s, seq(1, [1, 2, 3, 4, 5, 6], max_tokens=1))  # three full blocks indexed: A [1,2], B [3,4], C [5,6]
    a = next(iter(reversed(s.blocks.lru)))
    s.blocks.lru.move_to_end(a, last=False)  # make A the oldest, so it alone is evicted next
    run(s, seq(2, [7, 7], max_tokens=1))  # A's block, reused, now holds [7,7] and is indexed again
    assert s.prefix_cache.index[prefix_cache.block_key(hash((7, 7)))] == a
    d = seq(3, [7, 7, 3, 4, 5])
    run(s, d)
    assert d.num_cached_tokens == 2, "B's K/V follow [1,2], not [7,7]: B must not match"


def test_reset_forgets_every_block_and_running_work_continues():
    s = sched()
    run(s, seq(1, range(10, 20)))
    b = seq(2, range(10, 20), max_tokens=4)
    s.add(b)
    step(s)
    assert s.reset_prefix_cache() and not s.prefix_cache.index and not s.blocks.lru
    run(s)
    c, d = seq(3, range(10, 20)), seq(4, range(10, 20))
    run(s, c)
    run(s, d)
    assert c.num_cached_tokens == 0, "b's later blocks hang under forgotten ones: unreachable"
    assert d.num_cached_tokens == 8, "c's blocks, indexed after the reset, serve d"
    assert not Scheduler(8, 4, 2, 8).reset_prefix_cache(), "nothing to reset with the cache off"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14), st.integers(1, 6)), min_size=1, max_size=14),
       st.integers(8, 20), st.sampled_from([2, 4]))
def test_refcounts_and_free_lists_stay_exact_and_return_to_zero(reqs, num_blocks, bs):
    """Random prompts over four shared prefixes, a small pool (preemptions, evictions), random aborts:
    the invariants hold after every step, and at the end every block is free or cached and unreferenced."""
    s = Scheduler(num_blocks, bs, 3, 8, max_model_len=num_blocks * bs // 2, enable_prefix_caching=True)
    prefixes = [list(range(100 * k + 1, 100 * k + 9)) for k in range(4)]
    for i, (p, n, m) in enumerate(reqs):
        prompt = (prefixes[p] + list(range(50, 50 + n)))[: s.max_model_len // 2]
        s.add(seq(i, prompt, max_tokens=m))
    for k in range(2000):
        if not s.has_unfinished():
            break
        step(s)
        check_refcounts(s)
        if k % 7 == 3 and s.running:
            s.abort(s.running[0].req_id)
            check_refcounts(s)
    assert not s.has_unfinished()
    assert s.blocks.ref == [0] * num_blocks and s.blocks.num_free == num_blocks
