"""The rejection before the threshold search (sampling_reject, BLINK_SAMPLER_REJECT=R): the reference's tokens,
logprobs and top logprobs token for token, whichever rows it decides, leaves pending or does not take; the rows
it decides skip the search and race their one-token list."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.kernels import sampling_grid, sampling_reject_pass
from blink.kernels.sampling import keep_thresholds, race_uniform_ref, sample_ref, sample_triton
from blink.kernels.sampling_grid import RejectSetting, _Plan, reject_plan, reject_setting
from blink.kernels.sampling_plan import DECIDED, PENDING, SEARCH
from blink.kernels.sampling_ref import WEIGHT_SCALE, apply_penalties_ref, canonical
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling_race import assert_same, filtered_rows, sample_with_plan

PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.9, logprobs=2),
    SamplingParams(temperature=1.1, top_k=3),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.7, top_p=0.5, min_p=0.02),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9),  # top_p's total is over the top_k set: not taken
    SamplingParams(temperature=0.0, top_p=0.5),  # greedy: not filtered
    SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3, presence_penalty=0.4, logit_bias={3: 5.0}),
    SamplingParams(temperature=0.8),  # no filter
    SamplingParams(temperature=1.2, top_k=1),
    SamplingParams(temperature=0.6, top_p=0.05),
]
MARK = {int(DECIDED.value): "decided", int(PENDING.value): "pending", int(SEARCH.value): "search"}


def batch(vocab: int, num_rows: int, seed: int, ties: bool = False):
    state = SamplingState(len(PARAMS), vocab, "cpu")
    for slot, params in enumerate(PARAMS):
        state.set_slot(slot, params, seed=31 + 7 * slot, prompt_ids=[1, 2, 3, 40], output_ids=[5, 6])
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab, generator=gen) * torch.linspace(0.5, 4.0, num_rows)[:, None]
    if ties:
        logits = (logits * 2).round() / 2  # runs of equal values: the candidate's ties decide with it
    slots = torch.arange(num_rows, dtype=torch.int32) % len(PARAMS)
    slots[-1] = -1  # padding
    return logits, slots, torch.randint(0, 5000, (num_rows,), generator=gen), state


def marks(plan) -> list[str]:
    return [MARK[int(m)] for m in plan.reject_state[:, 0].tolist()]


def bounded_rows(logits, slots, state, reject_state) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows whose first round bounded the top_p total from the first race's masses (taken, top_p, no min_p)
    and the sampling_ref total of each row: the sum of every processed token's fixed-point weight."""
    slot = slots.clamp(min=0).long()
    x = canonical(apply_penalties_ref(logits, slots, state))
    scaled = x * (1.0 / torch.where(state.temperature[slot] > 0, state.temperature[slot], 1.0))[:, None]
    s_max = scaled.max(dim=1, keepdim=True).values
    exact = (torch.exp(scaled - s_max) * WEIGHT_SCALE).to(torch.int64).sum(dim=1)
    rows = ((slots >= 0) & (state.temperature[slot] > 0) & (state.top_p[slot] < 1) & (state.min_p[slot] <= 0)
            & (state.top_k[slot] <= 0) & (reject_state[:, 0] != SEARCH.value))
    return rows, exact


@pytest.mark.parametrize(("setting", "ties"), [("1k", False), ("3", True), ("3p", True)])
def test_the_reference_token_for_token(setting, ties):
    """A mixed batch (S = 21): every row the reference's; the taken rows are decided or pending, the others search
    (with "3" the top_k-only rows too); a decided row's race list is its token alone and the search never saw it."""
    vocab = 300
    logits, slots, positions, state = batch(vocab, 21, seed=len(setting), ties=ties)
    got, plan = sample_with_plan(logits, slots, positions, state, 2, 1024, reject=setting)
    assert_same(got, sample_ref(logits, slots, positions, state, 2),
                sample_triton(logits, slots, positions, state, 2, race=0, reject=0))
    slot = slots.clamp(min=0).long()
    top_k = state.top_k[slot] > 0
    taken = filtered_rows(slots, state) & ~(top_k & (state.top_p[slot] < 1))
    if not reject_setting(setting).top_k:
        taken &= ~top_k
    mark = marks(plan)
    assert all(m == "search" for m, t in zip(mark, taken.tolist(), strict=True) if not t)
    decided = torch.tensor([m == "decided" for m in mark])
    assert decided.sum() >= 7, mark  # most taken rows: one round decides top_p rows with probability >= top_p
    assert (plan.reject_state[decided, 1] == got.token_ids[decided]).all()
    assert (plan.race_count[decided] == 1).all() and (plan.race_ids[decided, 0] == got.token_ids[decided]).all()
    assert (plan.fell_back[decided] == 0).all()


def test_rows_left_pending_take_the_search():
    """top_k = 1 and top_p = 0.05 on flat rows rarely accept the first candidate: after one round some rows are
    still pending and the search gives them the reference's token; with eight rounds fewer are."""
    vocab = 400
    logits, slots, positions, state = batch(vocab, 10, seed=5)
    logits = logits * 0.2  # flat: the top-1 and the top 5% of the mass are far from the first candidate
    slots[:] = torch.tensor([8, 9, 8, 9, 8, 9, 8, 9, 8, 9], dtype=torch.int32)
    ref = sample_ref(logits, slots, positions, state, 0)
    pending = {}
    for rounds in (1, 8):
        got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, reject=f"{rounds}k")
        assert got.token_ids.tolist() == ref.token_ids.tolist()
        pending[rounds] = marks(plan).count("pending")
    assert pending[1] >= 3 and pending[8] < pending[1], pending


def peak_rows():
    """Twelve rows over four 1,024-token chunks: 8 min_p 0.5 rows (half with top_p 0.99) with one peak in chunk 0,
    then 4 flat top_p 0.5 rows; logits, slots, positions, state and the peaks' ids."""
    vocab, rows = 4096, 12
    state = SamplingState(3, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=1.0, min_p=0.5), seed=5, prompt_ids=[1])
    state.set_slot(1, SamplingParams(temperature=1.0, min_p=0.5, top_p=0.99), seed=6, prompt_ids=[1])
    state.set_slot(2, SamplingParams(temperature=1.0, top_p=0.5), seed=7, prompt_ids=[1])
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=gen)
    peaks = torch.randint(0, 1024, (rows,), generator=gen)
    logits[torch.arange(rows), peaks] = 6.0  # min_p keeps it alone: the rest lie more than ln 2 below
    logits[8:] *= 0.02  # flat rows for top_p 0.5
    return logits, torch.tensor([0, 1] * 4 + [2] * 4, dtype=torch.int32), torch.arange(rows) * 7, state, peaks


def test_the_next_candidate_is_decided_when_its_bounds_pass():
    """A peak in one chunk that min_p 0.5 keeps alone: the first race runs over each chunk's own cutoff, so its
    winner mostly lies in a peak-less chunk below the row's cutoff, and the round rejects it. The winner above it is
    the peak, and the round's counts bound the peak's: nothing above it, and the candidate's mass above less the
    peak's own weight (the rest of the row) under top_p's share. So min_p alone and top_p 0.99 rows are decided in
    that round (session 35: 3 of 8 min_p rows were left pending); on flat rows top_p 0.5's bound fails and the next
    round or the search decides, the reference's token either way."""
    logits, slots, positions, state, peaks = peak_rows()
    rows = len(slots)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, programs=4 * rows, reject="1")
    assert plan.num_chunks == 4
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    assert got.token_ids[:8].tolist() == peaks[:8].tolist()
    first = plan.reject_first_token.gather(1, plan.reject_first_best.argmax(dim=1, keepdim=True)).squeeze(1)
    assert (first[:8] != peaks[:8]).sum() >= 4, first  # most were decided by the bound, not by the first test
    mark = marks(plan)
    assert mark[:8] == ["decided"] * 8, mark
    assert "pending" in mark[8:], mark


def test_blocks_far_below_the_best_skip_the_race():
    """One program a row over four 1,024-token blocks: the second sits 40 below the first (beyond the noise's bound,
    its hash is skipped), the third 1 below (raced), the fourth at -inf but for one token (the weights' block
    branch). The reference's tokens, and the bound holds for the largest uniform the RNG draws."""
    vocab, rows = 4096, 6
    state = SamplingState(rows, vocab, "cpu")
    for slot, p in enumerate([SamplingParams(temperature=1.0, top_p=0.95), SamplingParams(temperature=0.7, top_k=40),
                              SamplingParams(temperature=1.0, min_p=0.05)] * 2):
        state.set_slot(slot, p, seed=3 + slot, prompt_ids=[1])
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(rows, vocab, generator=gen)
    logits[:, 1024:2048] -= 40.0
    logits[:, 2048:3072] -= 1.0
    logits[:, 3072:] = float("-inf")
    logits[:, 4000] = 0.5
    slots, positions = torch.arange(rows, dtype=torch.int32), torch.arange(rows) * 11
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 4096, programs=rows, reject="2k")
    assert plan.num_chunks == 1 and plan.chunk == 4096 and plan.block == 1024
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    largest_u = torch.tensor(((2**23 - 1) + 0.5) * 2.0**-23, dtype=torch.float32)
    assert -torch.log(-torch.log(largest_u)) < sampling_reject_pass.NOISE_BOUND.value


def test_a_first_candidate_below_the_rows_min_p_cutoff_is_rejected():
    """The penalties kernel races each chunk over min_p's cutoff from the chunk's own maximum: a superset. Here the
    row's maximum (5.0) sits alone in chunk 0 and 192 tokens at 3.0 fill the other chunks, inside their chunks'
    cutoffs (3 + log 0.5) but below the row's (5 + log 0.5): they hold 96% of the superset's mass, so most first
    candidates are among them, and the round must refuse them by min_p. The reference keeps token 7 alone."""
    vocab, rows = 256, 8
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=1.0, min_p=0.5), seed=5, prompt_ids=[1])
    row = torch.full((vocab,), float("-inf"))
    row[7], row[64:] = 5.0, 3.0
    logits, slots, positions = row.repeat(rows, 1), torch.zeros(rows, dtype=torch.int32), torch.arange(rows) * 3
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 256, programs=32, reject=2)
    assert plan.num_chunks == 4
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist() == [7] * rows
    best = plan.reject_first_best.gather(1, plan.reject_first_best.argmax(dim=1, keepdim=True)).squeeze(1)
    first = plan.reject_first_token.gather(1, plan.reject_first_best.argmax(dim=1, keepdim=True)).squeeze(1)
    assert torch.isfinite(best).all() and (first != 7).sum() >= 5, first  # the case this test is for
    assert marks(plan) == ["decided"] * rows  # the second round's candidate is token 7


_ROW = st.fixed_dictionaries({"temperature": st.sampled_from([0.0, 0.5, 1.0, 1.7]),
                               "top_p": st.sampled_from([1.0, 0.9, 0.5, 0.1]), "top_k": st.sampled_from([0, 1, 5, 40]),
                               "min_p": st.sampled_from([0.0, 0.05, 0.3])})


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(_ROW, min_size=1, max_size=5), scale=st.sampled_from([0.2, 1.0, 4.0]), ties=st.booleans(),
       setting=st.sampled_from(["1", "2k", "4k", "2t", "3kt", "3p", "4ktp"]), seed=st.integers(0, 2**16))
def test_any_rows_any_rounds_the_reference(rows, scale, ties, setting, seed):
    """Drawn rows (every mix of temperature, top_p, top_k and min_p, flat or peaked, with or without runs of ties)
    and settings: the reference's tokens, whatever the rejection decides or leaves to the search."""
    vocab = 200
    state = SamplingState(len(rows), vocab, "cpu")
    for slot, row in enumerate(rows):
        state.set_slot(slot, SamplingParams(**row), seed=seed + slot, prompt_ids=[1])
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), vocab, generator=gen) * scale
    if ties:
        logits = (logits * 2).round() / 2
    slots, positions = torch.arange(len(rows), dtype=torch.int32), torch.randint(0, 999, (len(rows),), generator=gen)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 256, reject=setting)
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    # The first round decides every taken row whose first candidate is kept: the penalties kernel's race over the
    # tokens min_p would keep if each chunk's maximum were the row's
    temperature, top_k, top_p, min_p = (state.temperature, state.top_k, state.top_p, state.min_p)
    inv_temperature = 1.0 / torch.where(temperature > 0, temperature, 1.0)
    scaled = logits * inv_temperature[:, None]
    chunks = torch.arange(vocab) // plan.chunk
    chunk_max = torch.stack([logits[:, chunks == c].max(dim=1).values for c in range(plan.num_chunks)], dim=1)
    cutoff = torch.where(min_p[:, None] > 0, chunk_max[:, chunks] * inv_temperature[:, None]
                         + torch.log(min_p)[:, None], float("-inf"))
    noise = -torch.log(-torch.log(race_uniform_ref(state.seed, positions, vocab)))
    first = torch.where(scaled >= cutoff, scaled + noise, float("-inf")).argmax(dim=1)
    value = logits.gather(1, first[:, None])
    kept = value.squeeze(1) >= keep_thresholds(logits, slots, state)
    taken = filtered_rows(slots, state) & ((top_k <= 0) | (reject_setting(setting).top_k & (top_p >= 1)))
    # except a top_p row whose mass above the candidate lies within the float bounds' band of its budget
    # (sampling_reject_bounds): an exact pass decides it, a later round or the search
    s_max = scaled.max(dim=1, keepdim=True).values
    in_set = (min_p[:, None] <= 0) | (scaled >= s_max + torch.log(min_p)[:, None])
    weights = torch.where(in_set, (torch.exp(scaled - s_max) * 2.0**32).to(torch.int64), 0).double()
    total, above = weights.sum(dim=1), torch.where(logits > value, weights, 0).sum(dim=1)
    near_budget = (top_p < 1) & ((above - top_p.double() * total).abs() <= 2.0**-10 * total + vocab)
    must = taken & kept & ~near_budget
    assert all(m == "decided" for m, need in zip(marks(plan), must.tolist(), strict=True) if need)


def test_the_setting(monkeypatch):
    R = RejectSetting
    assert reject_setting(3) == R(3) and reject_setting("3k") == R(3, top_k=True)
    assert reject_setting("0k") == R() and reject_setting("0t") == R() and reject_setting("0s") == R()
    assert reject_setting("2t") == R(2, test_first=True) and reject_setting("2kt") == R(2, True, True)
    assert reject_setting("3kts") == R(3, True, True, True) and reject_setting("2s") == R(2, separate=True)
    assert reject_setting("3p") == R(3, pool=True) and reject_setting("3ktps") == R(3, True, True, True, True)
    assert reject_setting("0p") == R()
    for bad in ("-1", "x", "9", "k", "3kk", "", "t", "3tk", "3tt", "3st", "3sk", "s", "3l", "3kl", "3pp", "3sp",
                "3pk", "3pt", "p"):
        with pytest.raises(ValueError, match="BLINK_SAMPLER_REJECT"):
            reject_setting(bad)
    assert reject_plan(1024, "2k") == R(2, True) and reject_plan(0, "2kt") == R()  # the list race
    # unset: one round, top_p / min_p rows only, up to 8 rows (sessions 34-36, one row since session 39, H100);
    # three at 17-32 rows (two in session 37, three since session 42); since session 47 three at 9-16 and three
    # pooled at 17-128; none else
    assert reject_plan(1024, rows=1) == R(1) and reject_plan(1024, rows=2) == R(1)
    assert reject_plan(1024, rows=8) == R(1) and reject_plan(1024, rows=9) == R(3) == reject_plan(1024, rows=16)
    assert reject_plan(1024, rows=17) == R(3, pool=True) == reject_plan(1024, rows=128)
    assert reject_plan(1024, rows=129) == R()
    assert _Plan(torch.zeros(1, 1000), race=1024).reject == 1 and _Plan(torch.zeros(8, 1000), race=1024).reject == 1
    assert _Plan(torch.zeros(16, 1000), race=1024).reject == 3 and _Plan(torch.zeros(129, 1000), race=1024).reject == 0
    assert _Plan(torch.zeros(64, 1000), race=1024).reject_pool_rounds
    monkeypatch.setattr(sampling_grid, "_REJECT_DEFAULT", reject_setting("3kt"))
    plan = _Plan(torch.zeros(2, 1000), race=1024)
    assert (plan.reject, plan.reject_top_k, plan.reject_test_first, plan.reject_separate,
            plan.reject_pool_rounds) == (3, True, True, False, False)
    assert _Plan(torch.zeros(2, 1000), race=0).reject == 0


@pytest.mark.parametrize("setting", ["3", "3t"])
@pytest.mark.parametrize(("top_p", "kept_ids"), [(0.69, {9, 30}), (0.71, {9, 30, 41})])
def test_top_p_at_its_boundary(top_p, kept_ids, setting):
    """Four tokens of mass 0.4, 0.3, 0.2, 0.1: the third has 0.7 of the mass above it, just past a 0.69 nucleus and
    just inside a 0.71 one, and a fifth of the first candidates are it. Over 24 draws every token is in the nucleus,
    the reference's, and three rounds decide every row (a candidate each of the 0.1, 0.2 and a kept token)."""
    vocab = 64
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=1.0, top_p=top_p), seed=99, prompt_ids=[1])
    row = torch.full((vocab,), -30.0)
    row[[9, 30, 41, 50]] = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    logits, slots, positions = row.repeat(24, 1), torch.zeros(24, dtype=torch.int32), torch.arange(24)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 64, reject=setting)
    ref = sample_ref(logits, slots, positions, state, 0)
    assert got.token_ids.tolist() == ref.token_ids.tolist() and set(ref.token_ids.tolist()) == kept_ids
    assert marks(plan).count("decided") == 24
