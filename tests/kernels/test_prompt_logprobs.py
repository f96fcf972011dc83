"""The prompt-logprob kernel (Triton, interpreted on the CPU) against its torch reference and log_softmax."""
import pytest
import torch

from blink.kernels.prompt_logprobs import prompt_logprobs_ref, prompt_logprobs_triton


def _outputs(rows: int, k: int):
    return (torch.full((rows,), 7.0), torch.full((rows,), -5, dtype=torch.int32),
            torch.full((rows, k), -3, dtype=torch.int64), torch.full((rows, k), 9.0))


@pytest.mark.parametrize("vocab", [50, 300])
def test_kernel_matches_reference_and_log_softmax(vocab):
    torch.manual_seed(vocab)
    rows, k = 6, 5
    logits = torch.randn(rows, vocab) * 3
    logits[2, 10] = logits[2, 11] = logits[2].max() + 1  # a tie at the top: the lower id goes first
    targets = torch.tensor([3, -1, 11, vocab - 1, 0, 17])
    num_top = torch.tensor([5, 5, 2, 0, 5, 1], dtype=torch.int32)
    want, got = _outputs(rows, k), _outputs(rows, k)
    prompt_logprobs_ref(logits, targets, num_top, *want)
    prompt_logprobs_triton(logits, targets, num_top, *got)
    lps = torch.log_softmax(logits, -1)
    for r in range(rows):
        if targets[r] < 0:  # padding: untouched
            assert got[0][r] == 7.0 and got[1][r] == -5 and (got[2][r] == -3).all()
            continue
        t = int(targets[r])
        assert got[0][r].item() == pytest.approx(lps[r, t].item(), abs=1e-5)
        assert got[1][r].item() == int((logits[r] > logits[r, t]).sum()) + 1
        n = int(num_top[r])
        assert got[2][r, :n].tolist() == want[2][r, :n].tolist()
        torch.testing.assert_close(got[3][r, :n], lps[r, got[2][r, :n]], atol=1e-5, rtol=0)
        assert (got[2][r, n:] == -3).all()  # past num_top: untouched
    assert got[2][2, :2].tolist() == [10, 11]
    assert got[1][2].item() == 1  # token 11 ties with 10 at the top: none is strictly above it
    for out_got, out_want in zip(got, want, strict=True):
        torch.testing.assert_close(out_got, out_want, atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_kernel_on_the_gpu_at_a_real_vocabulary():
    torch.manual_seed(0)
    rows, vocab, k = 64, 128256, 20
    logits = (torch.randn(rows, vocab, device="cuda") * 4).float()
    logits[5, 100:110] = logits[5].max() + 2  # ten-way tie at the top
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    targets[40:] = -1  # padding rows
    num_top = torch.randint(0, k + 1, (rows,), device="cuda", dtype=torch.int32)
    num_top[5] = k
    want = [t.cuda() for t in _outputs(rows, k)]
    got = [t.cuda() for t in _outputs(rows, k)]
    prompt_logprobs_ref(logits, targets, num_top, *want)
    prompt_logprobs_triton(logits, targets, num_top, *got)
    torch.cuda.synchronize()
    for out_got, out_want in zip(got, want, strict=True):
        torch.testing.assert_close(out_got, out_want, atol=2e-5, rtol=0)
    assert got[2][5, :10].tolist() == list(range(100, 110))


_COMPILE_SM90 = """
from blink.kernels.prompt_logprobs import _prompt_logprobs_kernel as fn
from tests.kernels.sm90 import compile_sm90
ptrs = {"logits_ptr": "*fp32", "targets_ptr": "*i64", "num_top_ptr": "*i32", "logprob_ptr": "*fp32",
        "rank_ptr": "*i32", "top_ids_ptr": "*i64", "top_lps_ptr": "*fp32"}
assert set(fn.arg_names) - set(ptrs) == {"vocab_size", "K", "BLOCK"}  # every other argument is a pointer
for vocab, block in [(128256, 4096), (151936, 4096), (50, 64)]:
    compile_sm90(fn, ptrs, {"vocab_size": vocab, "K": 20, "BLOCK": block}, num_warps=8)
"""


@pytest.mark.slow
def test_kernel_compiles_for_sm90():
    """The interpreter accepts what the compiler may not (loop-carried types, say): compile for the H200."""
    from tests.kernels.sm90 import run_uninterpreted

    run_uninterpreted(["-c", _COMPILE_SM90], timeout=300)
