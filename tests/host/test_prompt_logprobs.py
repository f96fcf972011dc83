"""Prompt logprobs in host mode (CPU) equal HF's log-softmax on tiny models: chunked by the per-step row
cap, batched with other requests, past the prefix cache, and with the generated tokens unchanged."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model

FAMILIES = ["llama", "qwen3"]
PROMPT = list(range(20, 45))  # 25 tokens
OTHER = [7, 8, 9, 10, 11, 12, 13]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {f: make_tiny_model(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


@torch.no_grad()
def hf_prompt_logprobs(path, prompt, k):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt])
    logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    lps = torch.log_softmax(logits, -1)
    out = {}
    for i in range(1, len(prompt)):
        row, t = logits[i - 1], prompt[i]
        top = torch.sort(-row, stable=True).indices[:k].tolist()
        out[i] = (t, lps[i - 1, t].item(), int((row > row[t]).sum()) + 1, top, lps[i - 1, top].tolist())
    return out


def run(eng: HostEngine, requests):
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    prompt_events, tokens, steps = {r: {} for r in requests}, {r: [] for r in requests}, 0
    while eng.has_unfinished():
        steps += 1
        assert steps < 500
        for ev in eng.step():
            if ev.is_prompt:
                assert not tokens[ev.req_id], "a prompt event after the first token"
                prompt_events[ev.req_id][-ev.position] = ev
            elif ev.token_id >= 0:
                tokens[ev.req_id].append(ev.token_id)
    return prompt_events, tokens, steps


def engine(path, **kw):
    args = dict(model=str(path), device="cpu", dtype="float32", max_num_seqs=4, max_num_batched_tokens=16,
                num_kv_blocks=48, block_size=4, max_prompt_logprob_rows=6)
    args.update(kw)
    return HostEngine(EngineArgs(**args))


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logprobs_equal_hf(tiny_dirs, family):
    path = tiny_dirs[family]
    k = 3
    want = hf_prompt_logprobs(path, PROMPT, k)
    greedy = dict(temperature=0.0, max_tokens=4, ignore_eos=True)
    eng = engine(path)
    requests = {1: (OTHER, SamplingParams(**greedy)),
                2: (PROMPT, SamplingParams(**greedy, prompt_logprobs=k)),
                3: (PROMPT, SamplingParams(**greedy, prompt_logprobs=0))}  # the same prompt: not from the cache
    got, tokens, _ = run(eng, requests)
    assert got[1] == {}
    for rid, num_top in [(2, k), (3, 0)]:
        assert sorted(got[rid]) == list(range(1, len(PROMPT)))  # every prompt token but the first, once
        for i, ev in got[rid].items():
            t, lp, rank, top, top_lps = want[i]
            assert ev.token_id == t and ev.rank == rank
            assert ev.logprob == pytest.approx(lp, abs=1e-4)
            assert ev.top_ids == top[:num_top]
            assert ev.top_logprobs == pytest.approx(top_lps[:num_top], abs=1e-4)
    # The generated tokens are those of a run without prompt logprobs (and without the row cap).
    plain, plain_tokens, _ = run(engine(path, max_prompt_logprob_rows=0),
                                 {r: (p, SamplingParams(**greedy)) for r, (p, _) in requests.items()})
    assert tokens == plain_tokens
    assert plain == {1: {}, 2: {}, 3: {}}


def test_row_cap_splits_the_prefill_and_keeps_the_cache_for_others(tiny_dirs):
    path = tiny_dirs["llama"]
    eng = engine(path, max_prompt_logprob_rows=4)
    plans = []
    schedule = eng.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append([(c.seq.req_id, c.start, c.num_tokens, c.num_prompt_rows) for c in plan.chunks])
        return plan

    eng.scheduler.schedule = spy
    greedy = dict(temperature=0.0, max_tokens=2, ignore_eos=True)
    run(eng, {1: (PROMPT, SamplingParams(**greedy))})  # fills the prefix cache
    got, _, _ = run(eng, {2: (PROMPT, SamplingParams(**greedy, prompt_logprobs=1))})
    assert sorted(got[2]) == list(range(1, len(PROMPT)))
    rows = [r for plan in plans for (rid, _, _, r) in plan if rid == 2]
    assert max(rows) == 4 and sum(rows) == len(PROMPT) - 1
    first = [c for plan in plans for c in plan if c[0] == 2][0]
    assert first[1] == 0  # request 2 skipped the cache: it prefilled from position 0
    assert eng.scheduler.prefix_cache.hits == 0
    run(eng, {3: (PROMPT, SamplingParams(**greedy))})  # a plain request still hits the cache
    assert eng.scheduler.prefix_cache.hits > 0


def test_engines_without_rows_refuse_prompt_logprobs(tiny_dirs):
    eng = engine(tiny_dirs["llama"], max_prompt_logprob_rows=0)
    with pytest.raises(ValueError, match="prompt logprobs are off"):
        eng.add_request(1, PROMPT, SamplingParams(prompt_logprobs=1))


def test_offline_llm_returns_vllm_shaped_prompt_logprobs(tiny_dirs):
    from blink.entrypoints.llm import LLM

    path = tiny_dirs["qwen3"]
    llm = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=48, block_size=4)
    out, plain = llm.generate([PROMPT, OTHER], [SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2),
                                                SamplingParams(temperature=0.0, max_tokens=2)])
    want = hf_prompt_logprobs(path, PROMPT, 2)
    assert plain.prompt_logprobs is None and out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        t, lp, _, top, top_lps = want[i]
        entry = out.prompt_logprobs[i]
        assert set(entry) == {t, *top}
        assert entry[t] == pytest.approx(lp, abs=1e-4)
        assert [entry[x] for x in top] == pytest.approx(top_lps, abs=1e-4)


def test_steps_without_prompt_rows_write_the_padding_once(tiny_dirs):
    # The P rows become padding after a step that used them, then stay untouched until a request asks
    # again: the common plain steps copy nothing for them, and no stale row reaches a later request.
    eng = engine(tiny_dirs["llama"], enable_prefix_caching=False)
    runner, fills = eng.runner, []
    fill = runner.fill

    def spy(buf, inputs):
        if "prompt_targets" in inputs:
            fills.append(inputs["prompt_targets"].tolist())
        fill(buf, inputs)

    runner.fill = spy
    plain = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    asks = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=2)
    first, _, steps = run(eng, {1: (PROMPT, asks)})
    padding = [i for i, targets in enumerate(fills) if targets == [-1] * 6]
    assert steps > len(fills) and padding == [len(fills) - 1]  # rows, one write of all P as padding, then none
    fills.clear()
    _, _, steps = run(eng, {2: (PROMPT, plain)})
    assert steps > 1 and fills == []
    again, _, _ = run(eng, {3: (PROMPT, asks)})
    assert [(e.logprob, e.rank, e.top_ids) for _, e in sorted(again[3].items())] == \
        [(e.logprob, e.rank, e.top_ids) for _, e in sorted(first[1].items())]
