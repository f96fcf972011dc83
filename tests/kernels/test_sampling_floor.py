"""top_k rows by the lane floor (sampling_floor, BLINK_SAMPLER_TOPK=floor): the reference's tokens, logprobs and top
logprobs token for token, with top_p over the top_k set, ties, penalties, the rejection before it, rows it does not
take (min_p, k beyond the pool) and rows whose copy overflows (the one-program search); the candidates it copies are
at least k and hold the row's top k."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.kernels.sampling import sample_ref
from blink.kernels.sampling_ref import apply_penalties_ref, canonical
from blink.kernels.sampling_state import SamplingState
from blink.kernels.sampling_topk import TOP_LANES
from blink.request import SamplingParams
from tests.kernels.test_sampling_race import on_cuda, sample_with_plan

PARAMS = [
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.0, top_k=20, top_p=0.7),  # top_p over the top_k set
    SamplingParams(temperature=0.9, top_k=3, min_p=0.1),  # min_p first: the search keeps it
    SamplingParams(temperature=0.7, top_k=40, logprobs=3),
    SamplingParams(temperature=0.8, top_k=1),
    SamplingParams(temperature=0.8, top_k=12, repetition_penalty=1.5, presence_penalty=0.7, logit_bias={4: 9.0}),
    SamplingParams(temperature=0.8, top_p=0.9),  # no top_k: the search
    SamplingParams(temperature=0.0, top_k=5),  # greedy
    SamplingParams(temperature=1.1, top_k=10_000),  # beyond the pool: the search
]


def batch(vocab: int, num_rows: int, seed: int, ties: bool = False):
    state = SamplingState(len(PARAMS), vocab, "cpu")
    for slot, params in enumerate(PARAMS):
        state.set_slot(slot, params, seed=17 + 5 * slot, prompt_ids=[1, 2, 9], output_ids=[4, 9])
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=gen) * torch.linspace(0.5, 4.0, num_rows)[:, None]
    if ties:
        logits = (logits * 2).round() / 2
    slots = torch.arange(num_rows, dtype=torch.int32) % len(PARAMS)
    slots[-1] = -1
    return logits, slots, torch.randint(0, 5000, (num_rows,), generator=gen), state


def floor_rows(slots, state, vocab, plan) -> torch.Tensor:
    slot = slots.clamp(min=0).long()
    top_k = state.top_k[slot]
    return ((slots >= 0) & (state.temperature[slot] > 0) & (top_k > 0) & (top_k < vocab)
            & (top_k <= plan.num_chunks * TOP_LANES) & (state.min_p[slot] <= 0))


def assert_reference(got, ref):
    assert got.token_ids.tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.top_ids, ref.top_ids)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("num_rows, reject", [(1, "1k"), (10, 0), (18, "2k")])
def test_the_reference_token_for_token(num_rows, reject, ties):
    vocab = 3000
    logits, slots, positions, state = batch(vocab, num_rows, seed=num_rows, ties=ties)
    ref = sample_ref(logits, slots, positions, state, 3)
    got, plan = sample_with_plan(logits, slots, positions, state, 3, 1024, reject=reject, floor=True)
    assert_reference(got, ref)
    assert plan.topk_floor and got.token_ids.tolist() == sample_with_plan(
        logits, slots, positions, state, 3, 1024, reject=reject, floor=False)[0].token_ids.tolist()


def test_the_copy_holds_the_top_k_and_skips_the_search():
    """A floor row's candidates: at least k, every token of the row's top k among them; its plan is never written
    (the refine kernel skipped it) and it did not fall back."""
    vocab, num_rows = 3000, 9
    logits, slots, positions, state = batch(vocab, num_rows, seed=3)
    _, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, floor=True)
    taken = floor_rows(slots, state, vocab, plan)
    assert plan.num_chunks == 3 and taken.tolist() == [True, False, False, False, True, True, False, False, False]
    x = canonical(apply_penalties_ref(logits, slots, state))
    for row in torch.nonzero(taken).flatten().tolist():
        k = int(state.top_k[slots[row]])
        count = int(plan.counters[row, 0])
        listed = set(plan.race_ids[row, :count].tolist())
        kth = torch.sort(x[row], descending=True).values[k - 1]
        assert count >= k and set(torch.nonzero(x[row] >= kth).flatten().tolist()) <= listed, row
        assert int(plan.fell_back[row]) == 0


def test_a_row_of_ties_overflows_into_the_search():
    """Every token equal: the floor keeps all of them, more than the candidates hold (1,024 here): the one-program
    search."""
    vocab = 3000
    logits, slots, positions, state = batch(vocab, 4, seed=5)
    logits[0] = 1.25  # slot 0: top_k 5
    ref = sample_ref(logits, slots, positions, state, 0)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, cand=1024, floor=True)
    assert_reference(got, ref)
    assert int(plan.counters[0, 0]) == vocab and int(plan.fell_back[0]) == 1


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 12), scale=st.sampled_from([0.05, 1.0, 6.0]), ties=st.booleans(), k=st.integers(1, 64),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), seed=st.integers(0, 2**16))
def test_any_rows_the_reference(rows, scale, ties, k, top_p, seed):
    vocab = 700
    gen = torch.Generator().manual_seed(seed)
    state = SamplingState(2, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.9, top_k=k, top_p=top_p), seed=seed, prompt_ids=[3], output_ids=[])
    state.set_slot(1, SamplingParams(temperature=1.3, top_k=max(1, k // 3)), seed=seed + 1, prompt_ids=[3],
                   output_ids=[])
    logits = torch.randn(rows, vocab, generator=gen) * scale
    if ties:
        logits = (logits * 4).round() / 4
    slots = torch.arange(rows, dtype=torch.int32) % 2
    positions = torch.randint(0, 5000, (rows,), generator=gen)
    ref = sample_ref(logits, slots, positions, state, 0)
    got, _ = sample_with_plan(logits, slots, positions, state, 0, 256, floor=True)
    assert_reference(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 32])
def test_gpu_real_vocab(num_rows):
    vocab = 128256
    logits, slots, positions, cpu_state = batch(vocab, num_rows + 1, seed=num_rows)
    logits = logits.bfloat16().float()
    state = on_cuda(cpu_state)
    ref = sample_ref(logits, slots, positions, cpu_state, 20)
    got, plan = sample_with_plan(logits.cuda(), slots.cuda(), positions.cuda(), state, 20, 16384, floor=True)
    assert_reference(type(got)(*(t.cpu() for t in got)), ref)
    assert int(plan.fell_back.sum()) == 0
