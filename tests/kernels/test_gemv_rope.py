"""The qkv GEMV with RoPE and the KV write in its epilogue (blink/kernels/gemv_rope.py) under the interpreter,
against the composition it replaces (gemv_ref, then rope_and_write_kv_ref). float32 and float16 only: the
interpreter's bf16 tl.dot is wrong."""
import pytest
import torch

from blink.kernels.gemv import GemvConfig
from blink.kernels.gemv_rope import gemv_rope_kv_ref, gemv_rope_kv_triton, supports

Q_HEADS, KV_HEADS, HEAD_DIM, HIDDEN, BLOCK = 4, 2, 32, 48, 4


def _case(m, prologue, dtype, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)
    n = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    angles = torch.rand(64, HEAD_DIM // 2, generator=gen) * 6.3
    blocks = 2 * m + 2
    slots = torch.randperm(blocks * BLOCK, generator=gen)[:m]
    slots[m // 2] = -1  # a padding row: no cache write
    return dict(x=rand(m, HIDDEN), weight=(torch.randn(n, HIDDEN, generator=gen) / HIDDEN**0.5).to(dtype),
                bias=rand(n) if bias else None, prologue=prologue,
                norm_weight=rand(HIDDEN) if prologue != "none" else None, eps=1e-5,
                residual=rand(m, HIDDEN) if prologue == "add_norm" else None,
                positions=torch.randint(0, 80, (m,), generator=gen),  # some beyond the table: clamped
                cos_sin=torch.cat((angles.cos(), angles.sin()), dim=-1),
                k_cache=rand(blocks, BLOCK, KV_HEADS, HEAD_DIM), v_cache=rand(blocks, BLOCK, KV_HEADS, HEAD_DIM),
                slot_mapping=slots, num_q_heads=Q_HEADS, num_kv_heads=KV_HEADS)


def _clone(case):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}


@pytest.mark.parametrize("block_n", [16, 32])  # two programs a head, one
@pytest.mark.parametrize("prologue,bias", [("none", True), ("add_norm", False), ("norm", False)])
@pytest.mark.parametrize("m", [2, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_qkv_matches_gemv_then_rope_and_kv_write(block_n, prologue, bias, m, dtype):
    case = _case(m, prologue, dtype, bias, seed=m + block_n)
    got_case, ref_case = _clone(case), _clone(case)
    config = GemvConfig(block_n=block_n, block_k=16, num_stages=2, dot=True)
    got, got_residual = gemv_rope_kv_triton(**got_case, config=config)
    ref, ref_residual = gemv_rope_kv_ref(**ref_case)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(got, ref, **tol)  # q and k rotated, v as is
    torch.testing.assert_close(got_case["k_cache"], ref_case["k_cache"], **tol)
    torch.testing.assert_close(got_case["v_cache"], ref_case["v_cache"], **tol)
    if prologue == "add_norm":
        torch.testing.assert_close(got_residual, ref_residual, atol=0, rtol=0)
    # the padding row's slot is -1: the caches hold their old values everywhere but at the real rows' slots
    written = torch.zeros(case["k_cache"].shape[0] * BLOCK, dtype=torch.bool)
    written[case["slot_mapping"][case["slot_mapping"] >= 0]] = True
    untouched = ~written.view(-1, BLOCK)
    assert torch.equal(got_case["k_cache"][untouched], case["k_cache"][untouched])
    assert torch.equal(got_case["v_cache"][untouched], case["v_cache"][untouched])


def test_fused_qkv_rotates_what_the_plain_gemv_computes():
    """Without positions (all 0: cos 1, sin 0) the fused kernel's qkv is the plain GEMV's: the pair-owning column
    map reads every W row once and puts every column back in place."""
    case = _case(3, "none", torch.float32, bias=False)
    case["positions"] = torch.zeros(3, dtype=torch.long)
    case["cos_sin"] = torch.cat((torch.ones(64, HEAD_DIM // 2), torch.zeros(64, HEAD_DIM // 2)), dim=-1)
    got, _ = gemv_rope_kv_triton(**_clone(case), config=GemvConfig(block_n=16, block_k=16, num_stages=2, dot=True))
    torch.testing.assert_close(got, case["x"] @ case["weight"].T, atol=1e-5, rtol=1e-5)


def test_supports_needs_head_aligned_tiles_and_the_kernel_of_its_rows():
    x, w = torch.zeros(4, HIDDEN), torch.zeros(8 * HEAD_DIM, HIDDEN)
    tiles = lambda n: GemvConfig(block_n=n, block_k=16, dot=True)
    assert supports(x, w, HEAD_DIM, tiles(16)) and supports(x, w, HEAD_DIM, tiles(32))
    assert not supports(x, w, HEAD_DIM, tiles(64))  # wider than a head
    one = torch.zeros(1, HIDDEN)
    assert not supports(one, w, HEAD_DIM, tiles(16))  # one row: the CUDA-core loop, not tensor cores
    assert supports(one, w, HEAD_DIM, GemvConfig(block_n=4, block_k=16))
    assert not supports(one, w, HEAD_DIM, GemvConfig(block_n=2, block_k=16))  # one pair a program: not taken
    assert not supports(x, w, HEAD_DIM, GemvConfig(block_n=16, block_k=16))  # 2+ rows: tensor cores only


@pytest.mark.parametrize("block_n", [4, 8, 32])  # 2 pairs a program (llama's default at one row), 4, a whole head
@pytest.mark.parametrize("prologue,bias", [("none", True), ("add_norm", False), ("norm", False)])
@pytest.mark.parametrize("num_stages", [1, 2])  # the register double buffer (the default), Triton's pipeliner
def test_one_row_matches_gemv_then_rope_and_kv_write(block_n, prologue, bias, num_stages):
    """One row on gemv.py's CUDA-core loop: qkv rotated, k and v in the cache at the row's slot (fp16, not bf16: the
    interpreter truncates fp32 -> bf16 where torch rounds)."""
    for dtype in (torch.float32, torch.float16):
        case = _case(1, prologue, dtype, bias, seed=block_n + num_stages)
        case["slot_mapping"] = torch.tensor([5])  # _case's padding row would be the only one
        got_case, ref_case = _clone(case), _clone(case)
        config = GemvConfig(block_n=block_n, block_k=16, num_stages=num_stages)
        got, got_residual = gemv_rope_kv_triton(**got_case, config=config)
        ref, ref_residual = gemv_rope_kv_ref(**ref_case)
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)
        torch.testing.assert_close(got, ref, **tol)
        torch.testing.assert_close(got_case["k_cache"], ref_case["k_cache"], **tol)
        torch.testing.assert_close(got_case["v_cache"], ref_case["v_cache"], **tol)
        assert not torch.equal(got_case["k_cache"], case["k_cache"])  # the row's slot was written
        if prologue == "add_norm":
            torch.testing.assert_close(got_residual, ref_residual, atol=0, rtol=0)
