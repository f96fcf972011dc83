"""The many-program selection (sampling_bucket, sampling_topk): equal to the sort definition on random rows
and parameters, through its candidate path and through its one-program fallback; on the GPU, captured in
a CUDA graph at a real vocabulary."""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blink.kernels import sampling_grid
from blink.kernels.pdl import pdl_switched
from blink.kernels.sampling import keep_thresholds, keep_thresholds_triton, sample, sample_ref, sample_triton
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling_filters import FILTER_PARAMS, tricky_rows


def filter_state(vocab: int, device: str = "cpu", logprobs: bool = False) -> SamplingState:
    """Every filter of FILTER_PARAMS; with logprobs, every other slot also asks for the top 20."""
    state = SamplingState(len(FILTER_PARAMS), vocab, device)
    for slot, params in enumerate(FILTER_PARAMS):
        if logprobs and slot % 2:
            params = dataclasses.replace(params, logprobs=20)
        state.set_slot(slot, params, seed=slot, prompt_ids=[])
    return state


def test_the_fallback_search_gives_the_same_thresholds_and_top_logprobs(monkeypatch):
    """Two candidates fit: nearly every row runs the one-program search instead, with the same result."""
    monkeypatch.setattr(sampling_grid, "CANDIDATES", 2)
    vocab = 200
    state = filter_state(vocab)
    rows = 2 * len(FILTER_PARAMS)
    logits = tricky_rows(rows, vocab, seed=5)
    slots = torch.arange(rows, dtype=torch.int32) // 2
    assert torch.equal(keep_thresholds_triton(logits, slots, state), keep_thresholds(logits, slots, state))
    logprob_state = SamplingState(1, vocab, "cpu")
    logprob_state.set_slot(0, SamplingParams(temperature=0.0, logprobs=5), seed=0, prompt_ids=[])
    zeros, positions = torch.zeros(rows, dtype=torch.int32), torch.arange(rows)
    ref = sample_ref(logits, zeros, positions, logprob_state, 5)
    assert torch.equal(sample_triton(logits, zeros, positions, logprob_state, 5).top_ids, ref.top_ids)


def test_the_long_sort_gives_the_same_thresholds_and_top_logprobs(monkeypatch):
    """Short sorts hold 2 candidates: rows with more take the full-size sort, with the same result."""
    monkeypatch.setattr(sampling_grid, "SHORT_SORT", 2)
    vocab = 200
    state = filter_state(vocab, logprobs=True)
    rows = len(FILTER_PARAMS)
    logits = tricky_rows(rows, vocab, seed=9)
    slots, positions = torch.arange(rows, dtype=torch.int32), torch.arange(rows)
    assert torch.equal(keep_thresholds_triton(logits, slots, state), keep_thresholds(logits, slots, state))
    assert torch.equal(sample_triton(logits, slots, positions, state, 20).top_ids,
                       sample_ref(logits, slots, positions, state, 20).top_ids)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.5, 3.0, 12.0]),
       temperature=st.sampled_from([0.3, 0.8, 1.0, 2.5]), top_k=st.sampled_from([0, 1, 5, 60, 400]),
       top_p=st.sampled_from([1.0, 0.05, 0.5, 0.9, 0.999]), min_p=st.sampled_from([0.0, 0.01, 0.3]),
       rounded=st.booleans())
def test_thresholds_and_top_logprobs_equal_the_reference_on_random_rows(seed, scale, temperature, top_k, top_p,
                                                                        min_p, rounded):
    vocab, rows = 300, 3
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * scale
    if rounded:  # bf16 rounding: many ties
        logits = logits.bfloat16().float()
    state = SamplingState(1, vocab, "cpu")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, logprobs=7)
    state.set_slot(0, params, seed=seed, prompt_ids=[])
    slots, positions = torch.zeros(rows, dtype=torch.int32), torch.arange(rows)
    assert torch.equal(keep_thresholds_triton(logits, slots, state), keep_thresholds(logits, slots, state))
    ref, got = sample_ref(logits, slots, positions, state, 7), sample_triton(logits, slots, positions, state, 7)
    assert torch.equal(got.token_ids, ref.token_ids)
    assert torch.equal(got.top_ids, ref.top_ids)


# ---- GPU -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 32])
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_gpu_sampler_in_a_cuda_graph_matches_the_reference(num_rows, pdl):
    """Captured as the engine captures it; with pdl, the seven kernels launch early and wait in-kernel (Hopper)."""
    with pdl_switched(pdl, "sampler"):  # read at each launch: the capture keeps it
        _sampler_in_a_graph_matches_the_reference(num_rows)


def _sampler_in_a_graph_matches_the_reference(num_rows):
    vocab = 128256
    cpu_state = filter_state(vocab, logprobs=True)
    cuda_state = filter_state(vocab, "cuda", logprobs=True)
    gen = torch.Generator().manual_seed(num_rows)
    logits = (torch.randn(num_rows, vocab, generator=gen) * 2.5).bfloat16().float()
    logits[:, :8] += 9.0  # a few likely tokens, like a real model
    slots = torch.arange(num_rows, dtype=torch.int32) % len(FILTER_PARAMS)
    positions = torch.arange(num_rows) * 7
    gpu_in = (logits.cuda(), slots.cuda(), positions.cuda())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(*gpu_in, cuda_state, 20)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(*gpu_in, cuda_state, 20)
    for _ in range(2):  # a replay leaves its scratch as the next one needs it
        graph.replay()
        torch.cuda.synchronize()
        ref = sample_ref(logits, slots, positions, cpu_state, 20)
        assert out.token_ids.cpu().tolist() == ref.token_ids.tolist()
        assert torch.equal(out.top_ids.cpu(), ref.top_ids)
    assert torch.equal(keep_thresholds_triton(*gpu_in[:2], cuda_state).cpu(), keep_thresholds(logits, slots, cpu_state))
