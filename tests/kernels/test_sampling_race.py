"""The list race (sampling_race, BLINK_SAMPLER_RACE=list) and the one-read compaction (sampling_compact,
BLINK_SAMPLER_COMPACT=once): the same tokens, logprobs and top logprobs as the reference and as the row race,
whichever rows' lists are complete, overflow or fall back; the same candidates and lists as the two reads."""
import functools

import pytest
import torch

from blink.kernels.sampling import (
    _choose_and_score,
    _keep_thresholds_triton,
    penalize_and_reject,
    sample_ref,
    sample_triton,
)
from blink.kernels.sampling_grid import RACE_CAPACITY, _Plan, race_capacity
from blink.kernels.sampling_penalties import prologue
from blink.kernels.sampling_ref import apply_penalties_ref, canonical, keep_thresholds
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling import mixed_rows, mixed_state


def sample_with_plan(logits, slots, positions, state, k, race, cand=None, once=False, programs=None, reject=0,
                     floor=False):
    """sample_triton's steps, with the plan kept to read its marks (cand: a smaller candidate capacity, so that
    wide rows fall back to the one-program search; reject: the rejection's rounds, sampling_reject; floor: top_k rows
    by the lane floor, sampling_floor)."""
    plan = _Plan(logits, programs=programs, race=race, compact_once=once, reject=reject, topk_floor=floor)
    if cand is not None:
        plan.cand = plan.small = cand
    processed = penalize_and_reject(logits, slots, positions, state, plan, k)
    threshold = _keep_thresholds_triton(logits, processed, slots, state, plan, k)
    return _choose_and_score(logits, processed, threshold, slots, positions, state, k, plan), plan


def on_cuda(cpu_state: SamplingState) -> SamplingState:
    """A CUDA copy of a CPU sampling state (the GPU tests' batches are built on the CPU for the reference)."""
    state = SamplingState(cpu_state.max_slots, cpu_state.vocab_size, "cuda")
    for name, tensor in vars(cpu_state).items():
        if isinstance(tensor, torch.Tensor):
            getattr(state, name).copy_(tensor)
    return state


def assert_same(got, ref, row_race):
    assert got.token_ids.tolist() == ref.token_ids.tolist()
    assert torch.equal(got.top_ids, ref.top_ids)
    torch.testing.assert_close(got.logprobs, ref.logprobs)
    torch.testing.assert_close(got.top_logprobs, ref.top_logprobs)
    # the penalties kernel's log-sum-exp partials are the choose kernel's own steps: the same bits
    assert torch.equal(got.logprobs, row_race.logprobs) and torch.equal(got.top_logprobs, row_race.top_logprobs)


def filtered_rows(slots, state):
    slot = slots.clamp(min=0).long()
    return (slots >= 0) & (state.temperature[slot] != 0) & ((state.top_k[slot] > 0) | (state.top_p[slot] < 1)
                                                            | (state.min_p[slot] > 0))


def assert_lists_hold_the_kept_tokens(logits, slots, state, plan):
    """A marked row's list holds every token its threshold keeps (and nothing twice)."""
    penalized = apply_penalties_ref(logits, slots, state)
    kept = canonical(penalized) >= keep_thresholds(penalized, slots, state)[:, None]
    for row, mark in enumerate(plan.race_count.tolist()):
        if mark >= 0:
            ids = plan.race_ids[row, :mark]
            assert len(set(ids.tolist())) == mark and kept[row].nonzero().squeeze(1).tolist() == sorted(
                i for i in ids.tolist() if kept[row, i])


@functools.cache
def _mixed_batch_and_its_row_race():
    """The S = 24 batch below and the row race's output on it, computed once for all four cases (the interpreter
    takes ~10 s a sampler call here)."""
    vocab = 777
    state = mixed_state(vocab)
    logits, slots, positions = mixed_rows(24, vocab, seed=3)
    return (logits, slots, positions, state), sample_triton(logits, slots, positions, state, 4, race=0)


@pytest.mark.parametrize(("race", "once"), [(1024, False), (1024, True), (16, True), (0, True)])
def test_mixed_rows_match_the_reference_and_the_row_race(race, once):
    """Penalties, bias, logprobs, greedy and padding rows beside top_p / top_k / min_p rows (S = 24): with room
    for every list, and with 16 ids a row, where the wider filters overflow and stream their row; the compaction
    reading its chunk twice or once (over 2 chunks a row: the one read's offsets matter)."""
    (logits, slots, positions, state), row_race = _mixed_batch_and_its_row_race()
    got, plan = sample_with_plan(logits, slots, positions, state, 4, race, once=once, programs=48 if once else None)
    assert_same(got, sample_ref(logits, slots, positions, state, 4), row_race)
    if race == 0:
        return  # no marks
    marks = plan.race_count
    filtered = filtered_rows(slots, state)
    assert (marks[~filtered] == -1).all()  # greedy, unfiltered and padding rows stream
    listed = marks >= 0
    assert listed.any() and (marks[listed] <= race).all()
    assert_lists_hold_the_kept_tokens(logits, slots, state, plan)
    if race == 16:
        assert (filtered & ~listed).any()  # some lists overflowed: those rows streamed


@pytest.mark.parametrize("once", [False, True])
def test_rows_that_fall_back_or_keep_the_whole_row_stream(once):
    """A flat row of ties whose candidates overflow a small candidate list takes the one-program search (its list
    is not marked, whatever fits); a top_k that keeps every token lists the whole row. Tokens: the reference's."""
    vocab = 600
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.9, top_k=5000),
              SamplingParams(temperature=0.7, min_p=0.3, logprobs=2), SamplingParams(temperature=1.1, top_k=3)]
    state = SamplingState(len(params), vocab, "cpu")
    for slot, p in enumerate(params):
        state.set_slot(slot, p, seed=17 + slot, prompt_ids=[1, 2, 3])
    gen = torch.Generator().manual_seed(11)
    logits = torch.cat([torch.randn(4, vocab, generator=gen) * 0.3, torch.randn(4, vocab, generator=gen) * 3])
    logits[0] = (logits[0] * 4).round() / 4  # a few values, each tied by many tokens: the fine buckets cannot split
    slots = torch.arange(8, dtype=torch.int32) % len(params)
    positions = torch.arange(8) * 5
    got, plan = sample_with_plan(logits, slots, positions, state, 2, 1024, cand=16, once=once, programs=16)
    assert_same(got, sample_ref(logits, slots, positions, state, 2),
                sample_triton(logits, slots, positions, state, 2, race=0))
    assert plan.fell_back[0] == 1 and plan.race_count[0] == -1  # the flat top_p row searched: not listed
    assert plan.race_count[1] == vocab and plan.race_count[5] == vocab  # top_k > vocab: the list is the row
    assert (plan.race_count[[2, 3, 6, 7]] >= 0).all()
    assert_lists_hold_the_kept_tokens(logits, slots, state, plan)


@pytest.mark.parametrize(("programs", "once"), [(None, True), (2, False)])
def test_one_row(programs, once):
    """S = 1: a penalized top_p row with logprobs, over the engine's 4 chunks (read once) and over two."""
    vocab = 2000
    state = SamplingState(1, vocab, "cpu")
    state.set_slot(0, SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2, logit_bias={7: 4.0},
                                     logprobs=3), seed=5, prompt_ids=[7, 8, 9], output_ids=[10])
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(1, vocab, generator=gen) * 2.5
    logits[0, :8] += 9.0
    slots = torch.zeros(1, dtype=torch.int32)
    for seed_position in range(3):  # a few draws: other tokens win
        positions = torch.tensor([77 + seed_position])
        ref = sample_ref(logits, slots, positions, state, 3)
        got = sample_triton(logits, slots, positions, state, 3, programs=programs, race=4096, compact_once=once)
        assert_same(got, ref, sample_triton(logits, slots, positions, state, 3, programs=programs, race=0))


def test_the_knobs_and_the_capacity(monkeypatch):
    from blink.kernels import sampling_grid

    assert race_capacity(128256, 0) == 0 and race_capacity(128256, 16384) == 16384
    assert race_capacity(777, 16384) == 1024  # never more than a row
    with pytest.raises(AssertionError):
        race_capacity(777, 1000)
    for name, (choices, default) in sampling_grid.KNOBS.items():
        monkeypatch.setenv(name, "yes")
        with pytest.raises(ValueError, match=name):
            sampling_grid._setting(name, choices, default)
        monkeypatch.delenv(name)
        assert sampling_grid._setting(name, choices, default) is True  # the new ways by default (sessions 17, 37, 39)
    monkeypatch.setattr(sampling_grid, "_RACE_DEFAULT", True)
    monkeypatch.setattr(sampling_grid, "_ONCE_DEFAULT", True)
    plan = _Plan(torch.zeros(2, 128256))
    assert plan.race == RACE_CAPACITY and plan.compact_once and plan.chunk_hist.shape == (2, plan.num_chunks, 256)


def test_the_one_read_compaction_lists_what_the_two_reads_do():
    """Over 4 chunks a row, the last one short (offsets from several earlier chunks): the same candidates and
    race lists (as sets: the order is free), the same thresholds."""
    vocab = 2000
    state = mixed_state(vocab, seed=4)
    logits, slots, positions = mixed_rows(8, vocab, seed=4)
    logits[3] = (logits[3] * 2).round() / 2  # a top_p row of ties across chunks
    runs = {}
    for once in (False, True):
        plan = _Plan(logits, programs=32, race=2048, compact_once=once, reject=0)
        assert plan.num_chunks == 4
        processed = torch.empty_like(logits)
        prologue(logits, processed, slots, state, plan, penalize=True)
        runs[once] = (_keep_thresholds_triton(logits, processed, slots, state, plan), plan)
    (twice, plan_twice), (once, plan_once) = runs[False], runs[True]
    assert torch.equal(once, twice) and torch.equal(plan_once.race_count, plan_twice.race_count)
    filtered = filtered_rows(slots, state).tolist()
    for row, mark in enumerate(plan_twice.race_count.tolist()):
        _, j_lo, j_hi, _, _, _, _, n = plan_twice.row_plans[row, :8].tolist()  # written for filtered rows only
        if filtered[row] and j_lo <= j_hi and n <= plan_twice.cand:  # n: the candidates the resolve reads
            assert sorted(plan_once.cand_i32[0, row, :n].tolist()) == sorted(plan_twice.cand_i32[0, row, :n].tolist())
        if mark >= 0:
            assert set(plan_once.race_ids[row, :mark].tolist()) == set(plan_twice.race_ids[row, :mark].tolist())
    assert (plan_twice.race_count >= 0).sum() >= 3
