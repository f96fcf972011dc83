"""moe_gemv.py: the experts as weight streams at decode sizes, against the torch reference and against the sort +
grouped GEMM path (Triton interpreter here, the GPU there), where experts_triton sends work to it, and the model's
switch (BLINK_MOE_GEMV)."""
from __future__ import annotations

import os

import pytest
import torch

from blink.kernels import gemv, moe, moe_gemv
from blink.kernels.moe_gemv import MAX_PAIRS, MoeGemvConfig, default_config, experts_gemv_triton
from blink.model import fusion
from blink.model.moe import FusedExperts, SparseMoeBlock
from blink.model.weights import load_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter's bf16 tl.dot is wrong


def _case(tokens, experts, top_k, hidden, inter, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).to(DEVICE, dtype)
    ids, weights = moe.route_ref(torch.randn(tokens, experts, generator=g).to(DEVICE), top_k, True)
    return x, w13, w2, ids, weights


# hidden and inter not multiples of the tiles (masks), a token count with repeated experts, Qwen3-30B-A3B's top-8
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 16, 8), (3, 8, 2), (8, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_matches_the_reference_and_the_grouped_gemm(tokens, experts, top_k, dtype):
    x, w13, w2, ids, weights = _case(tokens, experts, top_k, 72, 40, dtype, seed=tokens)
    got = experts_gemv_triton(x, w13, w2, ids, weights)
    grouped = moe.experts_triton(x, w13, w2, ids, weights)
    want = moe.experts_ref(x, w13, w2, ids, weights)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # the same rounding points as the grouped path; the sum over k in another order than the reference's
        torch.testing.assert_close(got.float(), grouped.float(), rtol=0, atol=2 * 2**-10 * grouped.abs().max().item())
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item())


def _rounded_like_the_kernels(x, w13, w2, ids, weights):
    """The streams' contract in float64, rounding to x's dtype where the kernels do: each projection, the
    activation, each pair's weighted output; the sum over k unrounded, then rounded once."""
    dt, inter = x.dtype, w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate_up = (w13[e].double() @ x[t].double()).to(dt).double()
            gate, up = gate_up[:inter], gate_up[inter:]
            act = (gate * torch.sigmoid(gate) * up).to(dt).double()
            down = (w2[e].double() @ act).to(dt).double()
            out[t] += (down * float(weights[t, k])).to(dt).double()
    return out.to(dt)


def test_rounds_where_the_grouped_path_does():
    """Half precision: all but near-ties equal to the float64 contract rounded at the kernels' points (a missing
    rounding of the pairs' outputs or of the projections moves a third or more of them)."""
    x, w13, w2, ids, weights = _case(4, 8, 4, 96, 64, HALF, seed=7)
    got = experts_gemv_triton(x, w13, w2, ids, weights).cpu()
    want = _rounded_like_the_kernels(*(t.cpu() for t in (x, w13, w2, ids, weights)))
    assert (got == want).float().mean() >= 0.97


def test_the_norm_prologue_rounds_where_rmsnorm_does():
    """gate_up's NORM prologue: all but near-ties equal to the contract over rms_norm's rounding of the row (x * rstd
    rounded, then times the weight, rounded)."""
    x, w13, w2, ids, weights = _case(3, 8, 4, 96, 64, HALF, seed=9)
    norm_w = (1 + 0.1 * torch.randn(96, generator=torch.Generator().manual_seed(9))).to(DEVICE, HALF)
    got = experts_gemv_triton(x, w13, w2, ids, weights, norm_weight=norm_w, eps=1e-5).cpu()
    xd = x.cpu().double()
    rstd = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    normed = ((xd * rstd).to(HALF).double() * norm_w.cpu().double()).to(HALF)
    want = _rounded_like_the_kernels(normed, *(t.cpu() for t in (w13, w2, ids, weights)))
    assert (got == want).float().mean() >= 0.97


@pytest.mark.parametrize("config", [MoeGemvConfig(2, 16), MoeGemvConfig(16, 64), MoeGemvConfig(4, 128)])
def test_any_tile_gives_the_same_sums(config):
    """Tiles narrower than the rows and K, wider than K: only the order of an fp32 sum changes."""
    x, w13, w2, ids, weights = _case(2, 8, 4, 72, 40, torch.float32, seed=5)
    got = experts_gemv_triton(x, w13, w2, ids, weights, config, config)
    torch.testing.assert_close(got, moe.experts_ref(x, w13, w2, ids, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter warns about the NaN rows
def test_padding_rows_leave_the_real_rows_alone():
    """A bucket's padding rows hold garbage; route_triton still picks real experts for them, and the real rows'
    output does not depend on them."""
    x, w13, w2, _, _ = _case(4, 8, 2, 32, 24, torch.float32, seed=3)
    logits = torch.randn(4, 8).to(DEVICE)
    logits[2:] = float("nan")
    x[2:] = float("nan")
    ids, weights = moe.route_triton(logits, 2, True) if DEVICE == "cuda" else moe.route_ref(logits, 2, True)
    ids = ids.clamp(0, 7).contiguous()
    weights = torch.nan_to_num(weights).contiguous()
    got = experts_gemv_triton(x, w13, w2, ids, weights)
    torch.testing.assert_close(got[:2], moe.experts_ref(x[:2], w13, w2, ids[:2], weights[:2]), rtol=1e-5, atol=1e-5)


def test_experts_triton_takes_it_up_to_gemv_pairs(monkeypatch):
    calls = []
    real = moe_gemv.experts_gemv_triton
    monkeypatch.setattr(moe_gemv, "experts_gemv_triton", lambda *a, **k: calls.append(a[3].numel()) or real(*a, **k))
    x, w13, w2, ids, weights = _case(3, 8, 2, 32, 24, torch.float32)
    want = moe.experts_ref(x, w13, w2, ids, weights)
    torch.testing.assert_close(moe.experts_triton(x, w13, w2, ids, weights, gemv_pairs=6), want, rtol=1e-5,
                               atol=1e-5)
    moe.experts_triton(x, w13, w2, ids, weights, gemv_pairs=5)  # 6 pairs > 5: the grouped GEMM
    moe.experts_triton(x, w13, w2, ids, weights)  # off by default
    big = _case(MAX_PAIRS // 2 + 1, 8, 2, 32, 24, torch.float32)
    moe.experts_triton(*big, gemv_pairs=10**6)  # past MAX_PAIRS whatever the model asks
    assert calls == [6]


def test_supports_only_what_the_kernels_take():
    x, w13, w2, ids, _ = _case(2, 8, 2, 32, 24, torch.float32)
    assert moe_gemv.supports(x, w13, w2, ids.numel())
    assert not moe_gemv.supports(x.half(), w13, w2, 4)  # mixed dtypes
    assert not moe_gemv.supports(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, 4)
    assert not moe_gemv.supports(x, w13, w2, MAX_PAIRS + 1)


def test_default_config_fills_the_last_wave():
    # Qwen3-30B-A3B at batch 1: 8 pairs x 768 rows of gate|up, 2,048 rows of down for one token
    up, down = default_config(768, 2048, 8), default_config(2048, 768, 1)
    for cfg, rows, items in ((up, 768, 8), (down, 2048, 1)):
        programs = items * -(-rows // cfg.block_n)
        assert programs % (4 * 132) == 0 or programs / (-(-programs // (4 * 132)) * 4 * 132) >= 0.9 or \
            cfg.block_n == max((4, 8, 16, 2), key=lambda bn: gemv._last_wave_fill(items * -(-rows // bn)))
        assert cfg.block_n * cfg.block_k <= 4096 and cfg.block_k >= 16


def test_the_environment_sets_the_model_switch(monkeypatch):
    monkeypatch.setenv("BLINK_MOE_GEMV", "8")
    assert fusion.policy_from_env().moe_gemv_pairs == 8
    model, _ = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32, seed=0)
    experts = [m for m in model.modules() if isinstance(m, FusedExperts)]
    assert experts and all(m.gemv_pairs == 8 for m in experts)
    monkeypatch.setenv("BLINK_MOE_NORMED", "0")
    model, _ = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32, seed=0)
    assert all(not m.normed_block for m in model.modules() if isinstance(m, FusedExperts))
    monkeypatch.setenv("BLINK_MOE_NORMED", "2")
    with pytest.raises(ValueError, match="BLINK_MOE_NORMED"):
        fusion.policy_from_env()
    monkeypatch.delenv("BLINK_MOE_NORMED")
    monkeypatch.delenv("BLINK_MOE_GEMV")  # unset: steps of one row on one rank (measured, session 33), none sharded
    assert fusion.policy_from_env().moe_gemv_pairs is None and fusion.policy_from_env(tp_size=2).moe_gemv_pairs == 0
    model, _ = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32, seed=0)
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert blocks and all(b.experts.gemv_pairs == b.top_k > 1 and b.experts.normed_block for b in blocks)
    monkeypatch.setenv("BLINK_MOE_GEMV", "row")
    assert fusion.policy_from_env().moe_gemv_pairs is None
    monkeypatch.setenv("BLINK_MOE_GEMV", "0")
    assert fusion.policy_from_env().moe_gemv_pairs == 0
    for bad in ("65", "-1", "yes", "rows"):
        monkeypatch.setenv("BLINK_MOE_GEMV", bad)
        with pytest.raises(ValueError, match="BLINK_MOE_GEMV"):
            fusion.policy_from_env()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the model on the CPU, its kernels interpreted")
def test_a_tiny_moe_model_through_the_streams(monkeypatch):
    """The model hands the kernels what they take: a tiny Qwen3-MoE step over the Triton MoE path with the streams
    on gives the reference's logits."""
    from tests.model.paged import PagedDriver

    monkeypatch.setenv("BLINK_MOE_GEMV", "64")
    model, _ = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32, seed=1)
    chunks = [{0: [1, 2, 3], 1: [4]}]
    expected = [PagedDriver(model).step(c) for c in chunks]
    from blink.model import moe as moe_model

    calls = []
    real = moe.fused_moe_triton  # the GPU's path, in the interpreter
    monkeypatch.setattr(moe_model, "fused_moe", lambda *a: calls.append(a[-1]) or real(*a))
    streams = []
    real_streams = moe_gemv.experts_gemv_triton
    monkeypatch.setattr(moe_gemv, "experts_gemv_triton", lambda *a: streams.append(1) or real_streams(*a))
    got = PagedDriver(model).step(chunks[0])
    for seq in chunks[0]:
        torch.testing.assert_close(got[seq], expected[0][seq], rtol=1e-4, atol=1e-4)
    assert calls and set(calls) == {64} and len(streams) == len(calls)


@pytest.mark.parametrize("top_k", [8, 2])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_the_normed_block_matches_its_ops(top_k, dtype):
    """One row: the router's GEMV with the residual add and norm in its prologue, route, the streams with the norm
    in gate_up, against the norm, router and experts as separate ops."""
    x, w13, w2, _, _ = _case(1, 16, top_k, 72, 40, dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    residual = torch.randn(1, 72, generator=g).to(DEVICE, dtype)
    norm_w = (1 + 0.1 * torch.randn(72, generator=g)).to(DEVICE, dtype)
    router_w = (torch.randn(16, 72, generator=g) / 72**0.5).to(DEVICE, dtype)
    args = (x, residual, norm_w, 1e-5, router_w, w13, w2, top_k, True)
    assert moe.normed_block_takes(x, router_w, w13, w2, top_k, 64)
    out, new_residual = moe.normed_block_triton(*args)
    want, want_residual = moe.normed_block_ref(*args)
    assert torch.equal(new_residual, want_residual)
    # the router's logits as the GEMV computes them route the reference too: a last-bit difference from cuBLAS's
    # must not swap an expert at the k-th place
    logits, _ = moe.gemv_triton(x, router_w, None, "add_norm", norm_w, 1e-5, residual)
    normed = moe.rms_norm_ref(x, norm_w, 1e-5, residual)[0]
    torch.testing.assert_close(logits.float(), torch.nn.functional.linear(normed, router_w).float(), rtol=2e-2,
                               atol=2e-2)
    want = moe.fused_moe_ref(normed, logits, w13, w2, top_k, True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol * want.abs().max().item())


def test_the_normed_block_takes_one_row_within_the_pairs():
    x, w13, w2, _, _ = _case(2, 16, 4, 72, 40, torch.float32)
    router_w = torch.randn(16, 72)
    assert moe.normed_block_takes(x[:1], router_w, w13, w2, 4, 4)
    assert not moe.normed_block_takes(x, router_w, w13, w2, 4, 64)  # two rows
    assert not moe.normed_block_takes(x[:1], router_w, w13, w2, 4, 3)  # more pairs than the model allows
    assert not moe.normed_block_takes(x[:1], router_w, w13, w2, 4, 0)  # off


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the model on the CPU, its kernels interpreted")
def test_a_tiny_moe_decode_row_through_the_normed_block(monkeypatch):
    """tiny Qwen3-MoE with BLINK_MOE_GEMV=64 and the Triton paths taken on the CPU: one-row decode steps run every
    sparse layer as the normed block, and the logits stay the reference's (fp32)."""
    from blink import kernels
    from blink.model import moe as moe_model
    from tests.model.paged import PagedDriver

    monkeypatch.setenv("BLINK_MOE_GEMV", "64")
    model, cfg = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32, seed=1)
    steps = [{0: [1, 2, 3]}, {0: [4]}, {0: [5]}]
    reference = PagedDriver(model)
    expected = [reference.step(c) for c in steps]
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)
    calls = []
    real = moe_model.normed_block_triton
    monkeypatch.setattr(moe_model, "normed_block_triton", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    driver = PagedDriver(model)
    for step, chunk in enumerate(steps):
        got = driver.step(chunk)
        torch.testing.assert_close(got[0], expected[step][0], rtol=1e-4, atol=1e-4)
    sparse = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    assert calls == [1] * (2 * sparse)  # the two one-row steps; the 3-token prefill took the unfused path
