"""Host-mode TP=2 (two CPU processes over gloo) against TP=1 and transformers, token for token.

Each case runs one mixed batch under a tight token budget and KV pool, so the run exercises chunked
prefill and preemption (asserted), greedy and seeded sampling with penalties, and top logprobs.
"""
from __future__ import annotations

import pytest
import torch

from blink.entrypoints.llm import LLM
from blink.request import SamplingParams
from tests.hf_models import load_hf_model, make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34, 35]]
PARAMS = [
    SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=5),
    SamplingParams(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=4, ignore_eos=True, repetition_penalty=1.2),
]
ENGINE = {"device": "cpu", "max_num_batched_tokens": 8, "num_kv_blocks": 6, "block_size": 4, "max_num_seqs": 4}
CASES = {
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen3": ("qwen3", {}),
    # One KV head for two ranks (replicated), tied embeddings and a vocabulary that does not split evenly.
    "qwen2-replicated-kv": ("qwen2", {"num_key_value_heads": 1, "tie_word_embeddings": True, "vocab_size": 1023}),
    "phi3-fused-checkpoint": ("phi3", {}),
    # Experts sharded on their intermediate dimension, the router replicated; one dense layer.
    "qwen3-moe": ("qwen3_moe", {}),
    # The shared expert's partial sums join the routed experts' before the block's one all-reduce.
    "qwen2-moe-shared-expert": ("qwen2_moe", {}),
}


def _run(path, tp: int):
    llm = LLM(str(path), tensor_parallel_size=tp, **ENGINE)
    try:
        outs = llm.generate(PROMPTS, PARAMS)
        return outs, llm.engine.stats()
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_matches_tp1_and_hf(tmp_path, case):
    family, overrides = CASES[case]
    path = make_tiny_model(tmp_path, family, **overrides)
    ref, ref_stats = _run(path, 1)
    got, stats = _run(path, 2)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert stats.preemptions > 0 and stats.preemptions == ref_stats.preemptions
    assert all(len(o.token_ids) == 10 for o in got)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(r.logprobs), atol=1e-4, rtol=1e-4)

    # The greedy request's top logprobs against transformers, teacher-forced on the same tokens.
    hf = load_hf_model(path)
    greedy = got[0]
    ids = torch.tensor([PROMPTS[0] + greedy.token_ids[:-1]])
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(ids).logits[0, len(PROMPTS[0]) - 1:].float(), dim=-1)
    for step, top in enumerate(greedy.top_logprobs):
        want_ids = logprobs[step].topk(5).indices.tolist()
        assert list(top) == want_ids
        torch.testing.assert_close(torch.tensor(list(top.values())), logprobs[step, want_ids],
                                   atol=1e-4, rtol=1e-4)


def test_tp2_preset_random_weights_match_tp1():
    """A preset's random weights are the same model at any TP size (the bf16 8B-shaped parity runs)."""
    outs = {}
    for tp in (1, 2):
        llm = LLM("tiny-llama", tensor_parallel_size=tp, device="cpu", num_kv_blocks=16)
        try:
            outs[tp] = [o.token_ids for o in llm.generate(
                [[5, 6, 7], [9, 8, 7, 6, 5]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))]
        finally:
            llm.engine.shutdown()
    assert outs[2] == outs[1]


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_tp4_matches_tp1(tmp_path, family):
    """Four ranks (issue 8's size, on the CPU): 4 attention heads, 1 each; 2 KV heads, each on two ranks;
    a vocabulary that does not split evenly (qwen3_moe: each expert's 32 columns split 4 ways). Same mixed
    batch as above, so chunked prefill and preemption."""
    path = make_tiny_model(tmp_path, family, vocab_size=1021)
    ref, ref_stats = _run(path, 1)
    got, stats = _run(path, 4)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert stats.preemptions > 0 and stats.preemptions == ref_stats.preemptions
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(r.logprobs), atol=1e-4, rtol=1e-4)
