"""Phi-3, Qwen3-MoE, Qwen2-MoE and Mixtral through the host engine (CPU): greedy tokens equal HF
transformers' token for token under a small token budget and KV pool, so the run goes through chunked
prefill and preemption."""
from __future__ import annotations

import os

import pytest

from blink.kernels.moe import fused_moe_triton
from blink.model import moe
from blink.request import FinishReason, SamplingParams
from tests.hf_models import make_tiny_model
from tests.host.test_host_engine import PROMPTS, engine, hf_greedy, run_all

CASES = {
    "phi3": ("phi3", {}),
    "qwen3-moe": ("qwen3_moe", {}),
    "qwen3-moe-step-2-raw-weights": ("qwen3_moe", {"decoder_sparse_step": 2, "mlp_only_layers": [],
                                                   "norm_topk_prob": False}),
    "qwen2-moe-shared-expert": ("qwen2_moe", {}),
    "mixtral": ("mixtral", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_hf_with_chunking_and_preemption(tmp_path, case):
    family, overrides = CASES[case]
    path = make_tiny_model(tmp_path, family, **overrides)
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


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU run of the Triton MoE kernels")
def test_triton_moe_kernels_in_the_engine_match_hf(tmp_path, monkeypatch):
    """The same run with routing, the sort and the grouped GEMMs in Triton (the interpreter here)."""
    monkeypatch.setattr(moe, "fused_moe", fused_moe_triton)
    path = make_tiny_model(tmp_path, "qwen3_moe")
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    eng = engine(path)
    tokens, _, _ = run_all(eng, {i: (p, greedy) for i, p in enumerate(PROMPTS)})
    assert all(tokens[i] == hf_greedy(path, p, 8) for i, p in enumerate(PROMPTS))
    assert eng.stats().preemptions > 0
