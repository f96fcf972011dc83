"""The rejection on the GPU (sampling_reject): the reference's tokens at V = 128,256 with the first round's float
bounds on the top_p total holding the exact one, and the rounds in one launch (sampling_reject_sync) deciding as a
launch a round does."""
import pytest
import torch

from blink.kernels.sampling import sample_ref
from blink.kernels.sampling_plan import DECIDED
from tests.kernels.test_sampling_race import on_cuda, sample_with_plan
from tests.kernels.test_sampling_reject import batch, bounded_rows, marks


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["1k", "3", "2t"])
def test_gpu_real_vocab(setting):
    """V = 128,256, bf16-rounded rows (ties go by token id), 40 rows of this file's mix: the reference's tokens and
    logprobs; most taken rows decided."""
    vocab = 128256
    logits, slots, positions, cpu_state = batch(vocab, 40, seed=len(setting))
    logits = logits.bfloat16().float()
    state = on_cuda(cpu_state)
    ref = sample_ref(logits, slots, positions, cpu_state, 20)
    got, plan = sample_with_plan(logits.cuda(), slots.cuda(), positions.cuda(), state, 20, 16384, reject=setting)
    assert got.token_ids.cpu().tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(got.logprobs.cpu(), ref.logprobs, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.top_ids.cpu(), ref.top_ids)
    assert marks(plan).count("decided") >= 10, marks(plan)  # ~13 expected at one round (top_p rows: >= top_p)
    # the first round's bounds on the top_p total, from float masses and the GPU's exp, hold the reference's
    reject_state = plan.reject_state.cpu()
    bounded, exact = bounded_rows(logits, slots, cpu_state, reject_state)
    lo, hi = reject_state[:, 2], reject_state[:, 3]
    assert bounded.any() and ((lo <= exact) | ~bounded).all() and ((exact <= hi) | ~bounded).all()


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["3", "3t"])
def test_gpu_rounds_in_one_launch(setting):
    """The rounds in one launch (sampling_reject_sync) against a launch a round: the same tokens, marks and lists, at
    32 rows (512 programs, all resident at once) and 48 (768: the later cells start as earlier rows finish)."""
    vocab = 128256
    for rows in (32, 48):
        logits, slots, positions, cpu_state = batch(vocab, rows, seed=rows)
        state = on_cuda(cpu_state)
        on_gpu = (logits.bfloat16().float().cuda(), slots.cuda(), positions.cuda())
        one, plan = sample_with_plan(*on_gpu, state, 2, 16384, reject=setting)
        each, each_plan = sample_with_plan(*on_gpu, state, 2, 16384, reject=setting + "s")
        assert not plan.reject_separate and each_plan.reject_separate
        assert one.token_ids.tolist() == each.token_ids.tolist()
        assert marks(plan) == marks(each_plan) and marks(plan).count("decided") >= rows // 4, marks(plan)
        chosen = plan.reject_state[:, 0] == DECIDED.value  # the token word is written for decided rows alone
        assert torch.equal(plan.reject_state[chosen, 1], each_plan.reject_state[chosen, 1])
        assert plan.counters[0, 6].item() == rows * plan.num_chunks  # every cell handed out once
