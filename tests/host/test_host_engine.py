"""Host engine end to end on tiny random models (CPU): parity with HF transformers, batching, chunked
prefill, preemption, seeded sampling, penalties, logit_bias, every stop condition and abort."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from blink.config import EngineArgs
from blink.entrypoints.llm import LLM
from blink.host.engine import HostEngine
from blink.request import FinishReason, SamplingParams
from tests.hf_models import make_tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]
PROMPTS = [[5, 9, 13], list(range(20, 47)), [7], list(range(100, 161))]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {f: make_tiny_model(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


def hf_greedy(path, prompt, n):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine(path, **kw) -> HostEngine:
    args = dict(model=str(path), device="cpu", dtype="float32", max_num_seqs=4, max_num_batched_tokens=16,
                num_kv_blocks=24, block_size=4)
    args.update(kw)
    return HostEngine(EngineArgs(**args))


def run_all(eng: HostEngine, requests: dict[int, tuple[list[int], SamplingParams]]):
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    tokens = {rid: [] for rid in requests}
    reasons = {}
    plans = []
    schedule = eng.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append([(c.seq.req_id, c.num_tokens, c.samples) for c in plan.chunks])
        return plan

    eng.scheduler.schedule = spy
    for _ in range(5000):
        if not eng.has_unfinished():
            break
        for ev in eng.step():
            assert ev.req_id not in reasons, "event after the finish event"
            if ev.token_id >= 0:
                assert ev.position == len(tokens[ev.req_id])
                tokens[ev.req_id].append(ev.token_id)
            if ev.finished:
                reasons[ev.req_id] = ev.finish_reason
    return tokens, reasons, plans


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_hf_with_chunking_and_preemption(tiny_dirs, family):
    path = tiny_dirs[family]
    n = 12
    greedy = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    eng = engine(path)
    tokens, reasons, plans = run_all(eng, {i: (p, greedy) for i, p in enumerate(PROMPTS)})
    for i, p in enumerate(PROMPTS):
        assert tokens[i] == hf_greedy(path, p, n), f"request {i} differs from HF"
        assert reasons[i] == FinishReason.LENGTH
    assert eng.stats().preemptions > 0, "the small KV pool should have forced a preemption"
    assert any(not samples for step in plans for _, _, samples in step), "expected a partial prefill chunk"
    assert any(len(step) > 1 for step in plans), "expected batched steps"
    assert eng.stats().free_kv_blocks == 24


def test_seeded_sampling_is_independent_of_the_batch(tiny_dirs):
    path = tiny_dirs["llama"]
    p = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=10, ignore_eos=True)
    alone, _, _ = run_all(engine(path), {0: (PROMPTS[1], p)})
    busy_reqs = {i + 1: (q, SamplingParams(temperature=1.0, seed=i, max_tokens=8, ignore_eos=True))
                 for i, q in enumerate(PROMPTS)}
    busy_reqs[0] = (PROMPTS[1], p)
    busy, _, _ = run_all(engine(path, num_kv_blocks=60), busy_reqs)
    assert busy[0] == alone[0]
    other_seed, _, _ = run_all(engine(path), {0: (PROMPTS[1], SamplingParams(**{**p.__dict__, "seed": 99}))})
    assert other_seed[0] != alone[0]


def test_logit_bias_and_repetition_penalty(tiny_dirs):
    path = tiny_dirs["llama"]
    biased = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logit_bias={77: 100.0})
    tokens, _, _ = run_all(engine(path), {0: (PROMPTS[0], biased)})
    assert tokens[0] == [77] * 5
    # Repetition penalty has the same definition in HF: compare greedy outputs.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([PROMPTS[1]])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                         do_sample=False, repetition_penalty=1.8, pad_token_id=0)[0, ids.shape[1]:].tolist()
    rp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.8)
    tokens, _, _ = run_all(engine(path), {0: (PROMPTS[1], rp)})
    assert tokens[0] == ref


def test_presence_and_frequency_penalties_discourage_repeats(tiny_dirs):
    path = tiny_dirs["llama"]
    base = dict(temperature=0, max_tokens=16, ignore_eos=True, logit_bias={77: 3.0, 78: 2.9})
    plain, _, _ = run_all(engine(path), {0: (PROMPTS[0], SamplingParams(**base))})
    freq, _, _ = run_all(engine(path), {0: (PROMPTS[0], SamplingParams(**base, frequency_penalty=2.0))})
    assert plain[0].count(77) > freq[0].count(77)
    assert len(set(freq[0])) > len(set(plain[0]))


def test_stop_conditions(tiny_dirs):
    path = tiny_dirs["llama"]
    eng = engine(path, num_kv_blocks=80)
    eos = eng.m.eos_token_ids[0]
    force_eos = {eos: 100.0}
    reqs = {
        0: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)),
        1: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=9, logit_bias=force_eos)),
        2: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=9, logit_bias=force_eos, min_tokens=3)),
        3: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=9, logit_bias={55: 100.0},
                                       stop_token_ids=[55])),
        4: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logit_bias=force_eos, ignore_eos=True)),
    }
    tokens, reasons, _ = run_all(eng, reqs)
    assert (len(tokens[0]), reasons[0]) == (4, FinishReason.LENGTH)
    assert (tokens[1], reasons[1]) == ([eos], FinishReason.STOP)
    assert (len(tokens[2]), reasons[2]) == (4, FinishReason.STOP)  # 3 tokens must come before the stop
    assert (tokens[3], reasons[3]) == ([55], FinishReason.STOP)
    assert (tokens[4], reasons[4]) == ([eos] * 6, FinishReason.LENGTH)
    # The context limit ends a request with "length".
    short = engine(path, max_model_len=10)
    tokens, reasons, _ = run_all(short, {0: (PROMPTS[0], SamplingParams(temperature=0, max_tokens=50,
                                                                        ignore_eos=True))})
    assert (len(tokens[0]), reasons[0]) == (7, FinishReason.LENGTH)


def test_abort_waiting_and_running_frees_blocks(tiny_dirs):
    eng = engine(tiny_dirs["llama"], max_num_seqs=1)
    p = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    eng.add_request(1, PROMPTS[1], p)
    eng.add_request(2, PROMPTS[0], p)
    eng.step()
    eng.step()
    assert eng.stats().running == 1 and eng.stats().waiting == 1
    eng.abort_request(2)  # waiting
    eng.abort_request(1)  # running (mid-prefill or decoding)
    events = eng.step()
    assert {(e.req_id, e.finish_reason) for e in events} == {(1, FinishReason.ABORT), (2, FinishReason.ABORT)}
    assert not eng.has_unfinished()
    assert eng.stats().free_kv_blocks == eng.stats().total_kv_blocks


def test_bad_requests_are_refused_with_one_line(tiny_dirs):
    eng = engine(tiny_dirs["llama"], max_model_len=32)
    with pytest.raises(ValueError, match="context length"):
        eng.add_request(1, list(range(1, 40)), SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        eng.add_request(2, [10**7], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        eng.add_request(3, [], SamplingParams())


def test_llm_generate_text_and_stop_strings(tiny_dirs):
    llm = LLM(model=str(tiny_dirs["llama"]), device="cpu", dtype="float32", num_kv_blocks=64)
    outs = llm.generate(["hello world", "a"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [8, 8]
    assert outs[0].text == llm.tokenizer.decode(outs[0].token_ids)
    full = outs[0].text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    if stop.strip():
        cut = llm.generate(["hello world"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                           stop=[stop]))[0]
        assert cut.finish_reason == "stop" and cut.text == full[: full.find(stop)]
