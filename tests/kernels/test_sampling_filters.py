"""Sampling's distribution and its filters: draws match the softmax (with temperature) and the top-k /
top-p / min-p renormalized odds; the Triton thresholds equal the sort definition on tricky rows; ties."""
import math

import pytest
import torch

from blink.kernels.sampling import (
    keep_thresholds,
    keep_thresholds_triton,
    sample_ref,
    sample_triton,
)
from blink.kernels.sampling_grid import PROGRAMS, _chunk_size, programs_for
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling import LOGITS_8


# ---- the distribution and the filters --------------------------------------------------------------
def sample_counts(params: SamplingParams, logits_row: torch.Tensor, draws: int = 20_000) -> torch.Tensor:
    vocab = logits_row.numel()
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, params, seed=2024, prompt_ids=[])
    out = sample_ref(logits_row.expand(draws, vocab).contiguous(), torch.zeros(draws, dtype=torch.int32),
                     torch.arange(draws), state, 0)
    return torch.bincount(out.token_ids, minlength=vocab).double()


def assert_frequencies_match(counts: torch.Tensor, probs: torch.Tensor):
    draws = counts.sum()
    freq = counts / draws
    bound = 5 * torch.sqrt(probs * (1 - probs) / draws) + 1e-3  # 5 sigma: never fails by chance
    assert ((freq - probs).abs() <= bound).all(), (freq, probs)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_frequencies_match_softmax(temperature):
    counts = sample_counts(SamplingParams(temperature=temperature), LOGITS_8)
    assert_frequencies_match(counts, torch.softmax(LOGITS_8.double() / temperature, -1))


def renormalized(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    probs = torch.where(keep, probs, 0)
    return probs / probs.sum()


def test_top_k_min_p_top_p_keep_the_right_tokens_with_the_right_odds():
    probs = torch.softmax(LOGITS_8.double(), -1)  # 0.40 0.25 0.15 0.09 0.05 0.03 0.02 0.003
    cases = [
        (SamplingParams(top_k=3), torch.arange(8) < 3),
        (SamplingParams(min_p=0.2), probs >= 0.2 * probs.max()),
        (SamplingParams(top_p=0.7), torch.arange(8) < 3),  # 0.40 + 0.25 < 0.7 <= + 0.15
        (SamplingParams(top_k=5, top_p=0.9), torch.arange(8) < 4),  # renormalized over the top 5
        (SamplingParams(min_p=0.1, top_p=0.95), torch.arange(8) < 5),
    ]
    for params, keep in cases:
        assert_frequencies_match(sample_counts(params, LOGITS_8), renormalized(probs, keep))


@pytest.mark.parametrize("impl", [sample_ref, sample_triton])
def test_top_k_1_and_tiny_top_p_are_greedy(impl):
    vocab = 500
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(7)) * 2
    state = SamplingState(3, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=1.5, top_k=1), seed=1, prompt_ids=[])
    state.set_slot(1, SamplingParams(temperature=1.5, top_p=1e-6), seed=1, prompt_ids=[])
    state.set_slot(2, SamplingParams(temperature=1.5, min_p=1.0), seed=1, prompt_ids=[])
    for slot in range(3):
        out = impl(logits, torch.full((8,), slot, dtype=torch.int32), torch.arange(8), state, 0)
        assert out.token_ids.tolist() == logits.argmax(-1).tolist()


def test_min_p_threshold():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    state = SamplingState(1, 5, "cpu")
    state.set_slot(0, SamplingParams(min_p=0.19), seed=1, prompt_ids=[])  # keeps p >= 0.095
    threshold = keep_thresholds(logits, torch.zeros(1, dtype=torch.int32), state)
    assert threshold.item() == pytest.approx(math.log(0.1))



FILTER_PARAMS = [
    SamplingParams(top_k=1), SamplingParams(top_k=2), SamplingParams(temperature=0.5, top_k=7),
    SamplingParams(top_k=150), SamplingParams(top_k=299), SamplingParams(top_k=300), SamplingParams(top_k=1000),
    SamplingParams(top_p=1e-6), SamplingParams(top_p=0.3), SamplingParams(temperature=2.0, top_p=0.9),
    SamplingParams(top_p=0.999), SamplingParams(min_p=0.01), SamplingParams(temperature=0.7, min_p=0.5),
    SamplingParams(min_p=1.0), SamplingParams(top_k=40, top_p=0.8), SamplingParams(top_k=3, min_p=0.2, top_p=0.5),
    SamplingParams(temperature=1.3, top_k=100, top_p=0.95, min_p=0.02), SamplingParams(),
    SamplingParams(temperature=0.0, top_k=5),
]


def tricky_rows(num_rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Continuous rows, rows full of ties, bf16-rounded rows, rows with -inf, signed zeros, constant rows."""
    gen = torch.Generator().manual_seed(seed)
    kinds = [
        lambda: torch.randn(vocab, generator=gen) * 3,
        lambda: torch.randint(-4, 5, (vocab,), generator=gen).float(),
        lambda: (torch.randn(vocab, generator=gen) * 4).bfloat16().float(),
        lambda: torch.where(torch.rand(vocab, generator=gen) < 0.3, float("-inf"), torch.randn(vocab, generator=gen)),
        lambda: torch.where(torch.rand(vocab, generator=gen) < 0.5, -0.0, 0.0)
        + torch.randint(0, 2, (vocab,), generator=gen).float(),
        lambda: torch.full((vocab,), 1.25),
    ]
    return torch.stack([kinds[i % len(kinds)]() for i in range(num_rows)])


def filter_batch(seed: int, vocab: int = 300):
    """Every kind of tricky row under every filter: (logits, slots, state)."""
    state = SamplingState(len(FILTER_PARAMS), vocab, "cpu")
    for slot, params in enumerate(FILTER_PARAMS):
        state.set_slot(slot, params, seed=slot, prompt_ids=[])
    rows = 6 * len(FILTER_PARAMS)
    return tricky_rows(rows, vocab, seed=seed), (torch.arange(rows, dtype=torch.int32) // 6), state


def test_triton_thresholds_equal_the_sort_definition_on_many_rows():
    logits, slots, state = filter_batch(seed=11)
    rows = len(slots)
    expected = keep_thresholds(logits, slots, state)
    fell_back = torch.full((rows,), -1, dtype=torch.int32)
    assert torch.equal(keep_thresholds_triton(logits, slots, state, fell_back=fell_back), expected)
    assert fell_back.sum() == 0  # the bucket plans resolved every row: none needed the one-program search
    assert (expected > float("-inf")).sum() > rows // 2  # most rows really were filtered
    # The threshold is an element of its row, or -inf (no filter, or a greedy row).
    for row in range(rows):
        assert expected[row] == float("-inf") or (logits[row] == expected[row]).any()


def test_top_k_keeps_every_tie_at_the_threshold():
    state = SamplingState(1, 6, "cpu")
    state.set_slot(0, SamplingParams(top_k=2), seed=0, prompt_ids=[])
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0, 0.0]])
    slots = torch.zeros(1, dtype=torch.int32)
    assert keep_thresholds(logits, slots, state).item() == 3.0
    assert keep_thresholds_triton(logits, slots, state).item() == 3.0


@pytest.mark.parametrize("k", [3, 7])  # the kernel's search starts from the chunk maxima when k <= #chunks (3)
def test_top_logprobs_order_ties_by_token_id(k):
    vocab = 90
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.0, logprobs=k), seed=0, prompt_ids=[])
    logits = torch.randint(-3, 3, (5, vocab), generator=torch.Generator().manual_seed(2)).float()
    slots, positions = torch.zeros(5, dtype=torch.int32), torch.arange(5)
    ref = sample_ref(logits, slots, positions, state, k)
    tri = sample_triton(logits, slots, positions, state, k)
    normalizer = torch.logsumexp(logits, -1)
    for row in range(5):
        by_hand = sorted(range(vocab), key=lambda t: (-logits[row, t].item(), t))[:k]
        assert ref.top_ids[row].tolist() == by_hand
        torch.testing.assert_close(ref.top_logprobs[row], logits[row, by_hand] - normalizer[row])
    assert torch.equal(tri.top_ids, ref.top_ids)
    torch.testing.assert_close(tri.top_logprobs, ref.top_logprobs)


@pytest.mark.parametrize("num_buckets", [32, 512])
def test_thresholds_do_not_depend_on_the_bucket_count(num_buckets):
    """The bucket count only trades the histogram's cost against candidates per bucket: coarse buckets put
    many tokens in the threshold's range (and ties, -inf, constant rows) and must still give the definition."""
    logits, slots, state = filter_batch(seed=12)
    expected = keep_thresholds(logits, slots, state)
    fell_back = torch.full((len(slots),), -1, dtype=torch.int32)
    assert torch.equal(keep_thresholds_triton(logits, slots, state, num_buckets=num_buckets, fell_back=fell_back),
                       expected)
    assert fell_back.sum() == 0


@pytest.mark.parametrize("programs", [PROGRAMS, 16])
def test_wide_thresholds_resolve_without_the_row_search(programs):
    """Thresholds far from the row's top: a top_p of 0.99 at temperature 1.5 (its boundary deep in the tail, where
    per-bucket weight bounds alone never reach 99% of the total: the plan bounds the tail through the exact
    total), flat rows whose top_p range is dense, a large top_k. All exact, and none takes the search, whether
    a row is cut into 10 chunks (the engine's 256 programs over 8 rows) or into 2 (16 programs)."""
    vocab = 20000
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.5, top_p=0.99),
              SamplingParams(temperature=0.8, top_k=3000), SamplingParams(temperature=0.8, top_k=50, top_p=0.95)]
    state = SamplingState(len(params), vocab, "cpu")
    for slot, p in enumerate(params):
        state.set_slot(slot, p, seed=slot, prompt_ids=[])
    gen = torch.Generator().manual_seed(5)
    flat = torch.randn(len(params), vocab, generator=gen)
    peaked = torch.randn(len(params), vocab, generator=gen) * 2.5
    peaked.scatter_add_(1, torch.randint(0, vocab, (len(params), 8), generator=gen), torch.full((len(params), 8), 9.0))
    logits = torch.cat([flat, peaked]).bfloat16().float()
    slots = torch.arange(2 * len(params), dtype=torch.int32) % len(params)
    fell_back = torch.full((len(slots),), -1, dtype=torch.int32)
    assert torch.equal(keep_thresholds_triton(logits, slots, state, fell_back=fell_back, programs=programs),
                       keep_thresholds(logits, slots, state))
    assert fell_back.tolist() == [0] * len(slots)
    positions = torch.arange(len(slots))
    ref = sample_ref(logits, slots, positions, state, 5)
    tri = sample_triton(logits, slots, positions, state, 5, programs=programs)
    assert torch.equal(tri.token_ids, ref.token_ids) and torch.equal(tri.top_ids, ref.top_ids)


def test_the_engine_cuts_larger_batches_into_shorter_chunks():
    """programs_for's sizes at llama-3's vocabulary: the chunks the H200 timed best (docs/perf.md, session 10):
    2k tokens at one row (any count), 8k at 32 rows (512 programs), 16k at 128 (1,024); an explicit count wins."""
    vocab = 128256
    assert [programs_for(s) // PROGRAMS for s in (1, 16, 17, 32, 33, 128)] == [1, 1, 2, 2, 4, 4]
    assert [_chunk_size(s, vocab) for s in (1, 32, 128)] == [2048, 8192, 16384]
    assert _chunk_size(32, vocab, PROGRAMS) == 16384 and _chunk_size(128, vocab, PROGRAMS) == 32768


def test_a_real_vocabulary_resolves_flat_and_peaked_rows_without_the_row_search():
    """Llama-3's 128,256 tokens (63 chunks, 4,096 candidates per row): a flat row, where one coarse level of
    1,024 buckets overflowed the candidates on the H200 (perf.md, 2026-12-01 session 8), and a peaked one."""
    vocab = 128256
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.8, top_p=0.9), seed=0, prompt_ids=[])
    gen = torch.Generator().manual_seed(7)
    peaked = torch.randn(vocab, generator=gen) * 2.5
    peaked[torch.randint(0, vocab, (8,), generator=gen)] += 9.0
    logits = torch.stack([torch.randn(vocab, generator=gen), peaked]).bfloat16().float()
    slots = torch.zeros(2, dtype=torch.int32)
    fell_back = torch.full((2,), -1, dtype=torch.int32)
    assert torch.equal(keep_thresholds_triton(logits, slots, state, fell_back=fell_back),
                       keep_thresholds(logits, slots, state))
    assert fell_back.tolist() == [0, 0]


def test_the_top_logprobs_floor_pools_every_chunks_top_lanes():
    """One row at Llama-3's vocabulary is cut into 63 chunks; the best chunk's own 20th-largest lane maximum let
    814 tokens of a peaked row through to the top-20 sort (more than the short sort takes). The floor from all
    chunks' top lanes pooled leaves a few dozen, and the top 20 stay exactly the reference's."""
    from blink.kernels.sampling import _choose_and_score, _keep_thresholds_triton
    from blink.kernels.sampling_grid import SHORT_SORT, _Plan
    from blink.kernels.sampling_penalties import prologue

    vocab = 128256
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.8, logprobs=20), seed=0, prompt_ids=[])
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, vocab, generator=gen) * 2.5
    logits[0, torch.randint(0, vocab, (8,), generator=gen)] += 9.0
    logits = logits.bfloat16().float()
    slots, positions = torch.zeros(1, dtype=torch.int32), torch.arange(1)
    plan = _Plan(logits, reject=0)
    assert plan.num_chunks == 63
    processed = torch.empty_like(logits)
    prologue(logits, processed, slots, state, plan, penalize=True, max_top_logprobs=20)
    threshold = _keep_thresholds_triton(logits, processed, slots, state, plan, 20)
    assert 20 <= int(plan.counters[0, 1]) < SHORT_SORT
    ref = sample_ref(logits, slots, positions, state, 20)
    # sample_triton's last step on the passes above (the interpreter takes minutes a pass at this vocabulary)
    tri = _choose_and_score(logits, processed, threshold, slots, positions, state, 20, plan)
    assert torch.equal(tri.top_ids, ref.top_ids) and torch.equal(tri.token_ids, ref.token_ids)
    torch.testing.assert_close(tri.top_logprobs, ref.top_logprobs)
