"""The rejection on the GPU (sampling_reject): the reference's tokens at V = 128,256 with the first round's float
bounds on the top_p total holding the exact one, and the rounds in one launch (sampling_reject_sync) deciding as a
launch a round does."""
import pytest
import torch

from blink.kernels.sampling import sample_ref
from blink.kernels.sampling_plan import DECIDED, POOL_DONE, POOL_TAIL, REJECT_CELLS
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
@pytest.mark.parametrize(("setting", "reference"), [("3", "3s"), ("3t", "3ts"), ("3p", "3s"), ("3tp", "3ts"),
                                                    ("3ps", "3s"), ("8kp", "8ks")])
def test_gpu_rounds_in_one_launch(setting, reference):
    """The rounds in one launch (sampling_reject_sync), or the later ones over the launch's pool of programs
    (sampling_reject_pool: "p", with "s" in a launch of their own), against the row's own rounds a launch a round:
    the same tokens, marks and lists, at 32 rows (512 programs, all resident at once) and 48 (768: the later cells
    start as earlier rows finish, and only the programs that start after the last cell join the pool)."""
    vocab = 128256
    pool = "p" in setting
    for rows in (32, 48):
        logits, slots, positions, cpu_state = batch(vocab, rows, seed=rows)
        if setting.startswith("8"):
            logits[: rows // 2] *= 0.2  # flat rows: many pending after a round, so the pool's rounds run
        state = on_cuda(cpu_state)
        on_gpu = (logits.bfloat16().float().cuda(), slots.cuda(), positions.cuda())
        one, plan = sample_with_plan(*on_gpu, state, 2, 16384, reject=setting)
        each, each_plan = sample_with_plan(*on_gpu, state, 2, 16384, reject=reference)
        assert plan.reject_pool_rounds == pool and each_plan.reject_separate
        assert one.token_ids.tolist() == each.token_ids.tolist()
        assert marks(plan) == marks(each_plan) and marks(plan).count("decided") >= rows // 4, marks(plan)
        chosen = plan.reject_state[:, 0] == DECIDED.value  # the token word is written for decided rows alone
        assert torch.equal(plan.reject_state[chosen, 1], each_plan.reject_state[chosen, 1])
        if not setting.endswith("s"):
            helpers = plan.pool_helpers if pool else 0  # every cell handed out once
            assert plan.counters[0, REJECT_CELLS.value] == rows * plan.num_chunks + helpers
        if pool:
            words = plan.pool_words.tolist()
            assert words[POOL_DONE.value] == rows  # every row done once, none lost
            if setting.startswith("8"):
                assert words[POOL_TAIL.value] > 0  # rows went through the pool's rounds
