"""Prefix caching end to end in host mode on the tiny families (CPU): greedy tokens identical with and
without the cache (prefix mid-block, on a block boundary, a whole prompt cached, multi-turn, preemption,
eviction under a small pool), cached_tokens exact, every reference back to zero."""
import pytest

from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]
BASE = list(range(30, 42))  # 12 tokens: three blocks of 4


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {f: make_tiny_model(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


def engine(path, cache: bool, **kw) -> HostEngine:
    args = dict(model=str(path), device="cpu", dtype="float32", max_num_seqs=4, max_num_batched_tokens=16,
                num_kv_blocks=24, block_size=4, enable_prefix_caching=cache)
    args.update(kw)
    return HostEngine(EngineArgs(**args))


def run(eng: HostEngine, requests: dict[int, list[int]], n: int = 6):
    """Submit all, step to the end: {id: tokens}, {id: cached_tokens of the finish event}."""
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    for rid, prompt in requests.items():
        eng.add_request(rid, prompt, params)
    tokens, cached = {rid: [] for rid in requests}, {}
    for _ in range(5000):
        if not eng.has_unfinished():
            break
        for ev in eng.step():
            if ev.token_id >= 0:
                tokens[ev.req_id].append(ev.token_id)
            if ev.finished:
                cached[ev.req_id] = ev.cached_tokens
    assert set(cached) == set(requests), "every request finished"
    return tokens, cached


def assert_clean(eng: HostEngine):
    s = eng.scheduler
    assert not s.running and s.blocks.ref == [0] * s.blocks.num_blocks
    assert s.blocks.num_free == s.blocks.num_blocks == eng.stats().free_kv_blocks
    assert all(s.blocks.cached[b] == (b in s.blocks.lru) for b in range(s.blocks.num_blocks)), \
        "every block is free, or cached and evictable"


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_is_identical_with_and_without_the_cache(tiny_dirs, family):
    path = tiny_dirs[family]
    on, off = engine(path, True), engine(path, False)
    # One at a time, so each hit is known exactly: (prompt, cached tokens expected).
    cases = [
        (BASE, 0),
        (BASE[:6] + [7, 8, 9], 4),  # the shared prefix ends mid-block: its one full block
        (BASE[:8] + [5, 6, 7, 8, 9], 8),  # ends on a block boundary
        (BASE[:8], 4),  # the whole prompt cached: its last block is recomputed for the logits
        (BASE, 8),
    ]
    for rid, (prompt, want) in enumerate(cases):
        got_on, cached_on = run(on, {rid: prompt})
        got_off, cached_off = run(off, {rid: prompt})
        assert got_on == got_off, f"case {rid}"
        assert (cached_on[rid], cached_off[rid]) == (want, 0), f"case {rid}"
    # Multi-turn: the next prompt resends the answer; generated tokens' blocks hit too (12 + 6 = 18
    # tokens, of which 17 were computed: four full blocks).
    turn2 = BASE + got_on[len(cases) - 1] + [3, 4]
    got_on, cached_on = run(on, {9: turn2})
    got_off, _ = run(off, {9: turn2})
    assert got_on == got_off and cached_on[9] == 16
    assert on.stats().prefix_cache_hits == 4 + 8 + 4 + 8 + 16 and off.stats().prefix_cache_queries == 0
    assert_clean(on)


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_under_preemption_and_eviction_in_a_small_pool(tiny_dirs, family):
    """Concurrent requests over two shared prefixes in a 14-block pool: preemptions (a preempted request
    comes back through the cache) and evictions, yet every token equals the cache-off run's."""
    path = tiny_dirs[family]
    prefixes = [list(range(60, 70)), list(range(80, 89))]
    reqs = {i: prefixes[i % 2] + [100 + i, 101 + i] * (1 + i % 3) for i in range(10)}
    on, off = engine(path, True, num_kv_blocks=14), engine(path, False, num_kv_blocks=14)
    evictions = []
    evict = on.scheduler.blocks.on_evict
    on.scheduler.blocks.on_evict = lambda b: (evictions.append(b), evict(b))
    got_on, cached = run(on, reqs, n=10)
    got_off, _ = run(off, reqs, n=10)
    assert got_on == got_off
    assert on.stats().preemptions > 0 and evictions and sum(cached.values()) > 0
    assert on.stats().prefix_cache_hits >= sum(cached.values())
    assert_clean(on)


def test_offline_llm_reports_cached_tokens_and_resets(tiny_dirs):
    from blink.entrypoints.llm import LLM

    llm = LLM(str(tiny_dirs["llama"]), device="cpu", dtype="float32", block_size=4, num_kv_blocks=32)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first, second = llm.generate(BASE, params)[0], llm.generate(BASE, params)[0]
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 8)
    assert first.token_ids == second.token_ids
    assert llm.reset_prefix_cache()
    assert llm.generate(BASE, params)[0].num_cached_tokens == 0
