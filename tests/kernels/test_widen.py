"""widen.py: a bf16 / fp16 GEMM output widened to fp32, bit for bit what torch's cast gives."""
import pytest
import torch

from blink.kernels import linear
from blink.kernels.widen import BLOCK, widen_triton


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widening_keeps_every_bit_across_program_edges(dtype):
    x = torch.randn(3, BLOCK + 77, generator=torch.Generator().manual_seed(0)).to(dtype)  # a short last program
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    got = widen_triton(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(got.view(torch.int32), x.float().view(torch.int32))  # NaN and -0 included


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_lm_heads_cublas_rows_come_out_as_the_cast_would():
    """Above the GEMV's rows linear() widens cuBLAS's bf16 output with the kernel: the same fp32 logits."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(3000, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    got = linear(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.nn.functional.linear(x, w).float())
