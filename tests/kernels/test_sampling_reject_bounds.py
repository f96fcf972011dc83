"""The rejection's float sums and their integer bounds (sampling_reject_bounds): the first round's bounds on top_p's
total hold the reference's exact total, a budget they cannot tell goes to an exact pass, and a first round that only
tests ("Rt") leaves exactly its refused candidates to the next round. The reference's tokens throughout."""
import pytest
import torch

from blink.kernels import sampling_reject
from blink.kernels.sampling import sample_ref
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling_race import sample_with_plan
from tests.kernels.test_sampling_reject import batch, bounded_rows, marks, peak_rows


def test_the_first_round_bounds_the_top_p_total_without_weighing_it():
    """top_p rows without min_p: the first round reads the total's bounds off the first race's float masses
    (row_total_bounds) instead of weighing every token. The sampling_ref total lies between them, they are within
    about 2^-12 of it, and the tokens are the reference's."""
    vocab, rows = 4096, 12
    state = SamplingState(3, vocab, "cpu")
    for slot, params in enumerate([SamplingParams(temperature=0.8, top_p=0.9),
                                   SamplingParams(temperature=1.3, top_p=0.5),
                                   SamplingParams(temperature=0.5, top_p=0.99, presence_penalty=0.7)]):
        state.set_slot(slot, params, seed=11 + slot, prompt_ids=[1], output_ids=[2, 3, 900])
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(rows, vocab, generator=gen) * torch.linspace(0.3, 6.0, rows)[:, None]
    logits[::4, 1000:1200] = float("-inf")  # a masked run: its chunk's mass is smaller, not NaN
    slots, positions = torch.arange(rows, dtype=torch.int32) % 3, torch.arange(rows) * 5
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, programs=4 * rows, reject="1")
    assert plan.num_chunks == 4
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    bounded, exact = bounded_rows(logits, slots, state, plan.reject_state)
    assert bounded.all(), marks(plan)
    lo, hi = plan.reject_state[:, 2], plan.reject_state[:, 3]
    assert ((lo <= exact) & (exact <= hi)).all(), (lo, exact, hi)
    assert ((hi - lo).double() <= 2.0**-10 * exact.double() + 2 * vocab + 2).all()  # not a vacuous bound

def test_a_budget_inside_the_totals_bounds_takes_the_search(monkeypatch):
    """With bounds of +-50% (BOUND_SLACK 0.5) a top_p 0.9 row accepts a candidate only under 0.45 of the mass and
    refuses none by mass: the rest cannot be told and go to the search, which gives the reference's tokens."""
    monkeypatch.setattr(sampling_reject, "BOUND_SLACK", 0.5)
    vocab, rows = 2048, 16
    logits, slots, positions, state = batch(vocab, rows, seed=4)
    slots[:] = 0  # PARAMS[0]: top_p 0.9
    got, plan = sample_with_plan(logits, slots, positions, state, 2, 1024, reject="2")
    ref = sample_ref(logits, slots, positions, state, 2)
    assert got.token_ids.tolist() == ref.token_ids.tolist()
    mark = marks(plan)
    assert "search" in mark and "pending" not in mark, mark  # nothing is refused by mass, so no second round
    exact = bounded_rows(logits, slots, state, plan.reject_state)[1]
    lo, hi = plan.reject_state[:, 2], plan.reject_state[:, 3]
    taken = torch.tensor([m == "decided" for m in mark])
    assert ((lo[taken] <= exact[taken]) & (exact[taken] <= hi[taken])).all()

@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_a_first_round_that_only_tests(rounds):
    """"Rt": the first round tests the first candidate in float and races nothing. A min_p row whose first
    candidate lies in a peak-less chunk (below the row's cutoff) stays pending after it, where "R" would have raced
    above it and decided the peak; the second round does that. Every row gets the reference's token."""
    logits, slots, positions, state, peaks = peak_rows()
    ref = sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, programs=48, reject=f"{rounds}t")
    assert plan.reject_test_first and got.token_ids.tolist() == ref
    first = plan.reject_first_token.gather(1, plan.reject_first_best.argmax(dim=1, keepdim=True)).squeeze(1)
    refused = (first[:8] != peaks[:8]).tolist()
    mark = marks(plan)
    if rounds == 1:
        assert any(refused) and [m == "pending" for m in mark[:8]] == refused, (mark, refused)
    else:
        assert mark[:8] == ["decided"] * 8, mark

def test_a_first_round_that_only_tests_leaves_what_its_bounds_cannot_tell(monkeypatch):
    """With bounds of +-50% the float test keeps a top_p 0.9 candidate only under ~0.3 of the mass and refuses none
    by mass, so most rows stay pending after it; the second round's exact test then still meets the total's bounds
    and sends them to the search. The reference's tokens either way."""
    monkeypatch.setattr(sampling_reject, "BOUND_SLACK", 0.5)
    logits, slots, positions, state = batch(2048, 16, seed=7)
    slots[:] = 0
    got, plan = sample_with_plan(logits, slots, positions, state, 2, 1024, reject="2t")
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 2).token_ids.tolist()
    assert "search" in marks(plan), marks(plan)
