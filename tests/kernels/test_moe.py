"""MoE kernels (Triton interpreter here, the GPU there) against their torch references: routing, the sort
by expert, the grouped GEMMs and the whole expert sum, with padding tokens and skewed routing."""
from __future__ import annotations

import pytest
import torch

from blink.kernels.moe import (
    align_ref,
    align_triton,
    block_m_for,
    experts_ref,
    experts_triton,
    route_ref,
    route_triton,
    sorted_capacity,
)
from blink.kernels.moe_gemm import grouped_gemm_ref, grouped_gemm_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter's bf16 tl.dot is wrong


@pytest.mark.parametrize(("tokens", "experts", "top_k", "renorm"), [(5, 8, 2, True), (33, 12, 3, False),
                                                                     (1, 128, 8, True)])
def test_route_matches_reference(tokens, experts, top_k, renorm):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
    ids, weights = route_triton(logits, top_k, renorm)
    ref_ids, ref_weights = route_ref(logits, top_k, renorm)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-6)
    if renorm:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens, device=DEVICE))


def _skewed_ids(tokens, experts, top_k, seed):
    """Distinct experts per token, most of them from a few hot experts (long runs, many empty experts)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g) + (torch.arange(experts) < 3).float()
    return scores.topk(top_k, dim=-1).indices.to(torch.int32).to(DEVICE)


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 16, 4), (7, 6, 2), (300, 10, 2)])
def test_align_matches_reference_and_sorts(tokens, experts, top_k):
    ids = _skewed_ids(tokens, experts, top_k, seed=tokens)
    block_m = block_m_for(ids.numel(), experts)
    sorted_ids, block_expert = align_triton(ids, experts, block_m)
    ref_sorted, ref_blocks = align_ref(ids, experts, block_m)
    assert sorted_ids.numel() == sorted_capacity(ids.numel(), experts, block_m)
    assert torch.equal(sorted_ids, ref_sorted) and torch.equal(block_expert, ref_blocks)
    pairs = ids.numel()
    real = sorted_ids[sorted_ids < pairs].long()
    assert sorted(real.tolist()) == list(range(pairs)), "every pair exactly once"
    flat = ids.flatten().long()
    owner = block_expert.long().repeat_interleave(block_m)
    placed = torch.nonzero(sorted_ids < pairs).flatten()
    assert torch.equal(owner[placed], flat[sorted_ids[placed].long()]), "each pair lies in its expert's blocks"


@pytest.mark.parametrize("gated", [True, False])
def test_grouped_gemm_matches_reference(gated):
    tokens, experts, top_k, hidden, inter = 9, 5, 2, 40, 24
    g = torch.Generator().manual_seed(1)
    ids = _skewed_ids(tokens, experts, top_k, seed=2)
    block_m = block_m_for(ids.numel(), experts)
    sorted_ids, block_expert = align_ref(ids, experts, block_m)
    if gated:
        a, weights = torch.randn(tokens, hidden, generator=g), None
        w = torch.randn(experts, 2 * inter, hidden, generator=g)
    else:
        a = torch.randn(sorted_ids.numel(), inter, generator=g)
        w, weights = torch.randn(experts, hidden, inter, generator=g), torch.rand(tokens, top_k, generator=g)
    args = [t.to(DEVICE) if t is not None else None for t in (a, w, sorted_ids, block_expert)]
    weights = weights.to(DEVICE) if weights is not None else None
    got = grouped_gemm_triton(*args, block_m, top_k, gated, weights)
    want = grouped_gemm_ref(*args, block_m, top_k, gated, weights)
    rows = (sorted_ids < ids.numel()).to(DEVICE) if gated else slice(None)  # padding rows stay unwritten
    torch.testing.assert_close(got[rows], want[rows], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(6, 8, 2), (70, 4, 3)])
def test_experts_match_reference(tokens, experts, top_k, dtype):
    hidden, inter = 32, 48
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    w13 = (0.2 * torch.randn(experts, 2 * inter, hidden, generator=g)).to(DEVICE, dtype)
    w2 = (0.2 * torch.randn(experts, hidden, inter, generator=g)).to(DEVICE, dtype)
    ids, weights = route_ref(torch.randn(tokens, experts, generator=g).to(DEVICE), top_k, True)
    got = experts_triton(x, w13, w2, ids, weights).float()
    want = experts_ref(x, w13, w2, ids, weights).float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # half: rounding points differ by one ulp
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter warns about the NaN rows
def test_garbage_padding_rows_still_route_to_real_experts():
    """A bucket's padding rows may hold NaN: they must pick real experts and leave the real rows exact."""
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    logits[4:] = float("nan")
    ids, weights = route_triton(logits, 2, True)
    assert ((ids >= 0) & (ids < 8)).all()
    ref_ids, ref_weights = route_ref(logits[:4], 2, True)
    assert torch.equal(ids[:4], ref_ids)
    torch.testing.assert_close(weights[:4], ref_weights)
    sorted_ids, _ = align_triton(ids, 8, block_m_for(ids.numel(), 8))
    assert sorted(sorted_ids[sorted_ids < ids.numel()].tolist()) == list(range(ids.numel()))


def test_moe_bench_runs_on_tiny_shapes(monkeypatch):
    """bench/kernels/moe_block.py end to end on the CPU (interpreter, fp16, timing stubbed), so its one GPU
    run does not die on a typo; its error column must be small."""
    from bench.kernels import moe_block as bench_moe

    monkeypatch.setattr(bench_moe, "DEVICE", DEVICE)
    monkeypatch.setattr(bench_moe, "DTYPE", HALF)
    if DEVICE == "cpu":
        monkeypatch.setattr(bench_moe, "graph_time_us", lambda calls, replays=30: [c() for c in calls] and 1.0)
    rows = bench_moe.main(["--batches", "1,40", "--experts", "8", "--top-k", "2", "--hidden", "32",
                           "--inter", "64", "--tp", "2"])
    assert [r["batch"] for r in rows] == [1, 40] and rows[0]["touched"] == 2
    assert all(r["err"] < 2e-2 and r["floor_us"] > 0 for r in rows)
    assert rows[0]["streams_err"] < 2e-2 and "streams_us" not in rows[1]  # 80 pairs: past moe_gemv.MAX_PAIRS
    # the streams alone in given tiles: the defaults first, then each gate_up tile, then each down tile
    tiled = bench_moe.main(["--batches", "1", "--experts", "8", "--top-k", "2", "--hidden", "32", "--inter", "64",
                            "--stream-tiles", "2x16w4s2,8x32w2s3;16x16w4s2"])
    tiles = tiled[0]["tiles"]
    assert [t["which"] for t in tiles] == ["default", "gate_up", "gate_up", "down"]
    assert tiles[2]["gate_up"] == bench_moe.MoeGemvConfig(8, 32, 2, 3) and tiles[3]["down"].block_n == 16
    assert all(t["err"] < 2e-2 for t in tiles)
