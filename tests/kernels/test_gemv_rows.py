"""The GEMV for 2..64 rows on tensor cores (blink/kernels/gemv_rows.py) under the interpreter: the one-pass norm
(rstd applied after the loop), the SiLU-mul epilogue on a gate|up weight, the new residual, against the composed
torch references. float32 and float16 only: the interpreter's bf16 tl.dot is wrong."""
import pytest
import torch

from blink import kernels
from blink.kernels import gemv
from blink.kernels.activation import silu_and_mul_ref
from blink.kernels.gemv import GemvConfig, GemvPlan, gemv_ref, gemv_triton


def _inputs(m, n, k, prologue, dtype, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)
    return dict(x=rand(m, 2 * k if prologue == "silu_mul" else k),
                weight=(torch.randn(n, k, generator=gen) / k**0.5).to(dtype), bias=rand(n) if bias else None,
                prologue=prologue, norm_weight=rand(k) if prologue in ("norm", "add_norm") else None, eps=1e-5,
                residual=rand(m, k) if prologue == "add_norm" else None)


def _tol(dtype):  # float16: s * g is rounded where the unfused norm rounds s * rstd (one ulp more)
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("prologue", ["none", "norm", "add_norm"])
@pytest.mark.parametrize("m", [2, 7, 16, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_epilogue_matches_gate_up_then_silu_mul(prologue, m, dtype):
    """gate|up [2N, K] (N = 40, not a multiple of the tiles) with bias: out is silu(gate) * up [M, N]."""
    args = _inputs(m, 80, 96, prologue, dtype, bias=True, seed=m)
    config = GemvConfig(block_n=16, block_k=32, num_stages=3, dot=True)
    got = gemv_triton(**args, config=config, epilogue="silu_mul")
    expected = gemv_ref(**args, epilogue="silu_mul")
    if prologue == "add_norm":
        torch.testing.assert_close(got[1], expected[1], atol=0, rtol=0)  # the new residual is exact
        got, expected = got[0], expected[0]
    assert got.shape == (m, 40) and got.dtype == dtype
    torch.testing.assert_close(got, expected, **_tol(dtype))
    # the epilogue rounds gate and up where the two kernels would: equal to the kernel's own gate|up, then SiLU-mul
    # (to one ulp of the output: tl.sigmoid and F.silu may differ in float32's last bit)
    plain = gemv_triton(**args, config=config)
    plain = plain[0] if prologue == "add_norm" else plain
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(got, silu_and_mul_ref(plain), atol=1e-6, rtol=ulp)


@pytest.mark.parametrize("prologue", list(gemv.PROLOGUES))
@pytest.mark.parametrize("m", [2, 16, 40])
def test_rows_kernel_matches_the_references_above_one_tile(prologue, m):
    """More rows than one tensor-core tile (BLOCK_M 64) and K not a multiple of the K step."""
    args = _inputs(m, 48, 104, prologue, torch.float32, bias=False, seed=7)
    got = gemv_triton(**args, config=GemvConfig(block_n=16, block_k=64, num_stages=2, dot=True))
    expected = gemv_ref(**args)
    if prologue == "add_norm":
        torch.testing.assert_close(got[1], expected[1], atol=0, rtol=0)
        got, expected = got[0], expected[0]
    torch.testing.assert_close(got, expected, **_tol(torch.float32))


def test_the_norm_is_one_pass_not_the_unfused_rounding():
    """float16, add_norm: close to the unfused norm + GEMM, and every row scaled by its own rstd (a row 100x
    larger than the others gives the same normalised output as the small one)."""
    args = _inputs(4, 32, 64, "add_norm", torch.float16, bias=False, seed=2)
    args["x"][1] = args["x"][0] * 100
    args["residual"][1] = args["residual"][0] * 100
    out, _ = gemv_triton(**args, config=GemvConfig(block_n=16, block_k=32, num_stages=2, dot=True))
    torch.testing.assert_close(out[1], out[0], atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out, gemv_ref(**args)[0], **_tol(torch.float16))


def test_default_configs_by_rows_and_epilogue():
    """Session 17's sweep on the H200 (llama3-8b shapes at 8 and 32 rows)."""
    assert gemv.default_config(14336, 4096, 8, "add_norm", "silu_mul") == GemvConfig(64, 64, num_stages=4, dot=True)
    assert gemv.default_config(6144, 4096, 8, "add_norm") == GemvConfig(64, 256, num_stages=3, dot=True)
    assert gemv.default_config(4096, 4096, 32) == GemvConfig(32, 512, num_stages=3, dot=True)
    assert gemv.default_config(128256, 4096, 8) == GemvConfig(64, 128, num_stages=4, dot=True)
    assert gemv.default_config(14336, 4096, 1, "add_norm", "silu_mul").dot  # an epilogue means tensor cores


def test_supports_the_epilogue_on_gate_up_weights_only():
    x = torch.zeros(4, 64)
    assert gemv.supports(x, torch.zeros(32, 64), "add_norm", "silu_mul")
    assert not gemv.supports(x, torch.zeros(31, 64), "add_norm", "silu_mul")  # no gate|up halves
    assert not gemv.supports(torch.zeros(4, 128), torch.zeros(32, 64), "silu_mul", "silu_mul")
    assert not gemv.supports(torch.zeros(gemv.MAX_M + 1, 64), torch.zeros(32, 64), "add_norm", "silu_mul")
    with pytest.raises(AssertionError, match="tensor cores"):
        gemv_triton(x, torch.zeros(32, 64), config=GemvConfig(block_n=4, block_k=64), epilogue="silu_mul")


def test_the_facade_fuses_the_silu_from_two_rows_on(monkeypatch):
    """norm_linear(silu_mul_out=True) gives silu(gate) * up on every path: the GEMV's epilogue (2+ rows), the
    norm + cuBLAS + SiLU-mul kernels (no plan, or more rows than max_m); silu_epilogue_takes says which."""
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)
    monkeypatch.setattr(kernels, "silu_and_mul", silu_and_mul_ref)  # the CUDA kernel's stand-in on the CPU
    monkeypatch.setattr(kernels, "rms_norm", kernels.rms_norm_ref)
    weight, norm_w = torch.randn(64, 32) / 6, torch.rand(32) + 0.5
    plan = GemvPlan(GemvConfig(block_n=16, block_k=32, num_stages=2, dot=True), max_m=4)
    for m, fused in [(1, False), (3, True), (4, True), (5, False)]:
        x, residual = torch.randn(m, 32), torch.randn(m, 32)
        assert kernels.silu_epilogue_takes(x, weight, plan) == fused
        got, new_residual = kernels.norm_linear(x, norm_w, 1e-5, weight, None, residual, plan, silu_mul_out=True)
        normed, expected_residual = kernels.rms_norm_ref(x, norm_w, 1e-5, residual)
        torch.testing.assert_close(got, silu_and_mul_ref(normed @ weight.T), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_residual, expected_residual)
    assert not kernels.silu_epilogue_takes(torch.randn(3, 32), weight, None)


def test_rows_pdl_has_its_own_switch_off_by_default(monkeypatch):
    """pdl.py's "gemv_rows" part: off unless BLINK_GEMV_ROWS_PDL=1, and never without the model's PDL."""
    import os

    from blink.kernels import pdl

    assert pdl._state["gemv_rows"] is (os.environ.get("BLINK_GEMV_ROWS_PDL", "0") == "1")
    monkeypatch.setattr(pdl, "pdl_for", lambda t: True)  # as on a Hopper GPU
    with pdl.pdl_switched(False, "gemv_rows"):
        assert not pdl.gemv_rows_pdl_for(torch.zeros(2, 8))
    with pdl.pdl_switched(True, "gemv_rows"):
        assert pdl.gemv_rows_pdl_for(torch.zeros(2, 8))
        monkeypatch.setattr(pdl, "pdl_for", lambda t: False)  # the model's switch off, or not a Hopper GPU
        assert not pdl.gemv_rows_pdl_for(torch.zeros(2, 8))
