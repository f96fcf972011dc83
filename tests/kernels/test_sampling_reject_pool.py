"""The rejection's later rounds over the launch's whole pool of programs (sampling_reject_pool, "Rp"): the same
decisions as the rows' own rounds, token for token and mark for mark, each pending row queued once a later round,
and the race key's order that of the per-chunk merge (the higher score, at a tie the lower id)."""
import pytest
import torch
import triton
import triton.language as tl

from blink.kernels.sampling import sample_ref
from blink.kernels.sampling_plan import DECIDED, POOL_CLAIM, POOL_DONE, POOL_QUEUE, POOL_TAIL
from blink.kernels.sampling_reject_pool import _key_token, _race_key
from tests.kernels.test_sampling_race import sample_with_plan
from tests.kernels.test_sampling_reject import batch, marks


def pending_rows(logits, slots, positions, state, setting) -> list[int]:
    _, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, reject=setting)
    return [row for row, mark in enumerate(marks(plan)) if mark == "pending"]


@pytest.mark.parametrize(("rounds", "flags"), [(3, ""), (8, "k"), (3, "t")])
def test_the_pool_decides_as_the_rows_own_rounds(rounds, flags):
    """Flat rows that top_k = 1 and top_p = 0.05 rarely accept at once (many rows pending after a round), with the
    mixed batch's other rows: the pool's rounds give the reference's tokens, the rows' own rounds' marks and chosen
    tokens, queue each row pending after round n < R once (so the queue holds the pending rows after rounds 1 to
    R - 1), count every row done once, and hand out every queued unit once (the interpreter's two programs each
    claim once more, past the end)."""
    vocab = 400
    logits, slots, positions, state = batch(vocab, 12, seed=rounds)
    logits[:8] *= 0.2
    slots[:8] = torch.tensor([8, 9] * 4, dtype=torch.int32)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, reject=f"{rounds}{flags}p")
    own, own_plan = sample_with_plan(logits, slots, positions, state, 0, 1024, reject=f"{rounds}{flags}")
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    assert got.token_ids.tolist() == own.token_ids.tolist()
    assert marks(plan) == marks(own_plan)
    chosen = plan.reject_state[:, 0] == DECIDED.value
    assert torch.equal(plan.reject_state[chosen, 1], own_plan.reject_state[chosen, 1])
    assert torch.equal(plan.race_ids[chosen, 0], own_plan.race_ids[chosen, 0])
    # entry: row * 16 + round; the interpreter runs the first round's rows in order, then each later round's
    expected = [row * 16 + n + 1 for n in range(1, rounds)
                for row in pending_rows(logits, slots, positions, state, f"{n}{flags}")]
    queued = len(expected)
    assert queued >= 4  # the case this test is for: rows go through the pool's rounds
    words = plan.pool_words
    assert words[POOL_TAIL.value] == queued and words[POOL_DONE.value] == len(slots)
    units = triton.cdiv(vocab, plan.pool_unit)
    assert units > plan.num_chunks  # a unit is smaller than a chunk: a round's work spreads wider
    assert words[POOL_CLAIM.value] == queued * units + 2
    queue = words[POOL_QUEUE.value:]
    # the entries no row took are marked never coming (-1); the queue's spare words stay 0
    later = len(slots) * (rounds - 1)
    assert len(queue) == 8 * len(slots) and queue[:queued].tolist() == expected
    assert (queue[queued:later] == -1).all() and (queue[later:] == 0).all()


def test_the_pool_with_one_round_only_counts_rows_done():
    """One round: nothing is queued, no pool launch runs (no claims), and no entry exists to mark."""
    logits, slots, positions, state = batch(300, 9, seed=1)
    got, plan = sample_with_plan(logits, slots, positions, state, 0, 1024, reject="1p")
    assert got.token_ids.tolist() == sample_ref(logits, slots, positions, state, 0).token_ids.tolist()
    words = plan.pool_words
    assert words[POOL_TAIL.value] == 0 and words[POOL_CLAIM.value] == 0 and words[POOL_DONE.value] == 9
    assert (words[POOL_QUEUE.value:] == 0).all()


@triton.jit
def _keys_kernel(best_ptr, token_ptr, key_ptr, back_ptr, N: tl.constexpr, VOCAB: tl.constexpr):
    i = tl.arange(0, N)
    key = _race_key(tl.load(best_ptr + i), tl.load(token_ptr + i))
    tl.store(key_ptr + i, key)
    tl.store(back_ptr + i, _key_token(key, VOCAB))


def test_the_race_key_orders_as_the_merge():
    """Scores of both signs, -0.0 beside 0.0, equal scores at several ids, the largest id: a larger key is a larger
    score or, at an equal score (-0.0 equals 0.0), a lower id, and the key gives its token back."""
    vocab = 128256
    best = torch.tensor([3.5, -2.0, 0.0, -0.0, 3.5, -1e-30, 1e-30, -2.0, 17.25, 17.25, -80.0, 0.0, -0.0, 5.0, 5.0, 4.9])
    token = torch.tensor([7, 9, 40, 39, 6, 1, 2, 3, 100, vocab - 1, 0, 41, 38, 12, 11, 0], dtype=torch.int32)
    key = torch.empty(16, dtype=torch.int64)
    back = torch.empty(16, dtype=torch.int32)
    _keys_kernel[(1,)](best, token, key, back, 16, vocab)
    assert back.tolist() == token.tolist()
    for i in range(16):
        for j in range(16):
            better = best[i] > best[j] or (best[i] == best[j] and token[i] < token[j])
            assert (key[i] > key[j]) == better, (i, j)
