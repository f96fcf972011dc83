"""The decode GEMV (blink/kernels/gemv.py) and its prologues against the kernels they replace, under the
interpreter; the load-time policy (blink/model/fusion.py); the model with every projection on the GEMV."""
import dataclasses
import os

import pytest
import torch
import triton

from blink import kernels
from blink.kernels import gemv
from blink.kernels.gemv import GemvConfig, GemvPlan, gemv_ref, gemv_triton
from blink.model.fusion import FusionPolicy, apply_fusion_policy
from blink.model.weights import load_model
from tests.model.paged import PagedDriver


def _inputs(m, n, k, prologue, dtype, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)
    x = rand(m, 2 * k if prologue == "silu_mul" else k)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    return dict(x=x, weight=weight, bias=rand(n) if bias else None, prologue=prologue,
                norm_weight=rand(k) if prologue in ("norm", "add_norm") else None, eps=1e-5,
                residual=rand(m, k) if prologue == "add_norm" else None)


@pytest.mark.parametrize("prologue", list(gemv.PROLOGUES))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_matches_the_composed_references(prologue, bias, dtype):
    """The one-row CUDA-core loop. N and K are not multiples of the tiles: the masks at both edges are exercised."""
    args = _inputs(1, 44, 104, prologue, dtype, bias=bias)
    config = GemvConfig(block_n=8, block_k=32)
    got, expected = gemv_triton(**args, config=config), gemv_ref(**args)
    if prologue != "add_norm":
        got, expected = (got,), (expected,)
    # bf16: the interpreter truncates fp32 -> bf16 where torch rounds, at up to three points.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=6e-2, rtol=2**-5)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == dtype
        torch.testing.assert_close(g, e, **tol)
    if prologue == "add_norm":
        torch.testing.assert_close(got[1], (args["x"].float() + args["residual"].float()).to(dtype), **tol)


@pytest.mark.parametrize("prologue", list(gemv.PROLOGUES))
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter's bf16 tl.dot is wrong
@pytest.mark.parametrize("stages", [1, 3])  # the explicit double buffer, or W loaded in the loop for the pipeliner
def test_tensor_core_variant_matches_the_references(prologue, m, dtype, stages):
    args = _inputs(m, 40, 96, prologue, dtype, bias=True, seed=3)
    got = gemv_triton(**args, config=GemvConfig(block_n=16, block_k=32, dot=True, num_stages=stages))
    expected = gemv_ref(**args)
    if prologue == "add_norm":
        torch.testing.assert_close(got[1], expected[1], atol=1e-3, rtol=1e-3)
        got, expected = got[0], expected[0]
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got, expected, **tol)


def test_gemv_reads_strided_rows():
    """x may be a row-strided view (a slice of a wider activation), as the model's inputs can be."""
    wide = torch.randn(4, 160)
    weight = torch.randn(24, 96) / 10
    got = gemv_triton(wide[:, :96], weight, config=GemvConfig(block_n=16, block_k=64, dot=True))
    torch.testing.assert_close(got, wide[:, :96] @ weight.T, atol=1e-5, rtol=1e-5)
    one = gemv_triton(wide[1:2, :96], weight, config=GemvConfig(block_n=4, block_k=64))
    torch.testing.assert_close(one, wide[1:2, :96] @ weight.T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", [GemvConfig(block_n=8, block_k=32), GemvConfig(block_n=16, block_k=32, dot=True)])
def test_float32_output_is_the_rounded_output_cast(config):
    """The LM head's logits come out as float32 without a cast kernel, equal to x's dtype output then .float()."""
    args = _inputs(1, 40, 96, "none", torch.float16, bias=True, seed=4)
    narrow = gemv_triton(**args, config=config)
    wide = gemv_triton(**args, config=config, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, narrow.float())
    assert gemv_ref(**args, out_dtype=torch.float32).dtype == torch.float32


def test_more_than_one_row_needs_the_tensor_core_loop():
    with pytest.raises(AssertionError, match="tensor cores"):
        gemv_triton(torch.randn(2, 64), torch.randn(16, 64), config=GemvConfig(block_n=4, block_k=64))


def test_supports_only_decode_shapes():
    weight = torch.zeros(32, 64)
    assert gemv.supports(torch.zeros(gemv.MAX_M, 64), weight)
    assert not gemv.supports(torch.zeros(gemv.MAX_M + 1, 64), weight)  # more rows: cuBLAS
    assert not gemv.supports(torch.zeros(2, 64), weight, "silu_mul")  # silu_mul needs gate|up: 2K columns
    assert gemv.supports(torch.zeros(2, 128), weight, "silu_mul")
    assert not gemv.supports(torch.zeros(2, 60), torch.zeros(32, 60))  # K % 8: no 16-byte rows


def test_default_config_fills_the_last_wave_at_one_row_and_takes_tensor_cores_above():
    slots = 4 * 132

    def fill(n, bn):
        programs = triton.cdiv(n, bn)
        return programs / (triton.cdiv(programs, slots) * slots)
    for n, k in [(6144, 4096), (4096, 14336), (28672, 4096), (128256, 4096), (64, 48)]:
        config = gemv.default_config(n, k, 1)
        assert not config.dot and config.num_stages == 1
        assert config.block_n * config.block_k == 4096 or config.block_k == triton.next_power_of_2(k)
        assert fill(n, config.block_n) >= min(0.9, max(fill(n, w) for w in (4, 8, 2)))
        for m in (2, 8, 16):
            config = gemv.default_config(n, k, m)
            assert config.dot and config.block_n >= 16 and config.num_stages > 1
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:  # llama3-8b
        assert gemv.default_config(n, k, 1) == GemvConfig(block_n=4, block_k=1024)
    # session 14 and 17 sweeps on the H200: the o projection at M = 8 and 16, the LM head
    assert gemv.default_config(4096, 4096, 8) == GemvConfig(block_n=32, block_k=512, num_stages=3, dot=True)
    assert gemv.default_config(4096, 4096, 16) == GemvConfig(block_n=32, block_k=512, num_stages=3, dot=True)
    assert gemv.default_config(128256, 4096, 8) == GemvConfig(block_n=64, block_k=128, num_stages=4, dot=True)
    # the SiLU-mul prologue computes a sigmoid per x element per program: 8 rows a program from M = 1 on
    assert gemv.default_config(4096, 14336, 1, "silu_mul") == GemvConfig(block_n=8, block_k=512)
    assert gemv.default_config(4096, 14336, 1, "add_norm") == GemvConfig(block_n=4, block_k=1024)


def test_policy_parsing_and_load_time_choice():
    assert FusionPolicy.parse("").gemv == frozenset()
    assert FusionPolicy.parse("all").gemv == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert FusionPolicy.parse(" qkv, down ").gemv == {"qkv", "down"}
    with pytest.raises(ValueError, match="unknown projection.*'up'"):
        FusionPolicy.parse("qkv,up")
    with pytest.raises(ValueError, match="BLINK_GEMV_MAX_M"):
        FusionPolicy.parse("all", max_m=gemv.MAX_M + 1)
    with pytest.raises(ValueError, match=f"BLINK_GEMV_MAX_M.*{gemv.MAX_M + 1}"):
        FusionPolicy.parse("all", max_m=f"1,o:{gemv.MAX_M + 1}")
    with pytest.raises(ValueError, match="unknown projection 'up'"):
        FusionPolicy.parse("all", max_m="1,up:4")
    with pytest.raises(ValueError, match="ROWS,projection:ROWS"):
        FusionPolicy.parse("all", max_m="1,o=4")
    wide = FusionPolicy.parse("all", max_m=" 1, o:16,lm_head:8")
    assert [wide.rows_for(r) for r in ("qkv", "o", "gate_up", "down", "lm_head")] == [1, 16, 1, 1, 8]
    model, cfg = load_model("tiny-qwen3-moe", "cpu", dtype=torch.float32)
    dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    taken = apply_fusion_policy(model, FusionPolicy.parse("all", max_m=4))
    layers = cfg.num_hidden_layers
    assert taken == {"qkv": layers, "o": layers, "gate_up": dense, "down": dense, "lm_head": 1}
    assert model.model.layers[0].self_attn.qkv_proj.gemv.max_m == 4
    apply_fusion_policy(model, FusionPolicy.parse("all", max_m="1,o:16"))
    attention = model.model.layers[0].self_attn
    assert (attention.qkv_proj.gemv.max_m, attention.o_proj.gemv.max_m) == (1, 16)
    apply_fusion_policy(model, FusionPolicy())
    assert all(getattr(m, "gemv", None) is None for m in model.modules())


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3-moe"])
def test_model_on_the_gemv_gives_the_reference_logits(monkeypatch, preset):
    """Every projection on the GEMV (norms and SiLU-mul in its prologues) vs the cuBLAS path, fp32; the
    10-token prefill has more rows than max_m and must fall back to the unfused path in the same step."""
    model, _ = load_model(preset, "cpu", dtype=torch.float32, seed=1)
    chunks = [{0: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}, {0: [11], 1: [12, 13, 14]}, {0: [15], 1: [16]}]
    reference = PagedDriver(model)
    expected = [reference.step(c, pad_tokens=1, pad_seqs=1) for c in chunks]
    calls, epilogues = [], []
    real = gemv.gemv_triton

    def spy(*a, **k):
        calls.append(a[0].shape[0])
        epilogues.append((a[0].shape[0], k.get("epilogue", "none")))
        return real(*a, **k)
    monkeypatch.setattr(kernels, "gemv_triton", spy)
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)
    monkeypatch.setattr(gemv, "default_config",  # fewer programs; more rows on tensor cores, as the default's
                        lambda n, k, m=1, prologue="none", epilogue="none":
                        GemvConfig(block_n=32, block_k=32, dot=m > 1 or epilogue != "none"))
    apply_fusion_policy(model, FusionPolicy.parse("all", 8))
    driver = PagedDriver(model)
    for step, c in enumerate(chunks):
        got = driver.step(c, pad_tokens=1, pad_seqs=1)
        for seq in c:
            torch.testing.assert_close(got[seq], expected[step][seq], rtol=1e-4, atol=1e-4)
    assert calls and max(calls) <= gemv.MAX_M and 5 in calls  # the decode steps (4 + 1 pad rows) took it
    if preset != "tiny-qwen3-moe":  # dense MLPs from two rows on: silu(gate) * up in gate|up's epilogue
        assert (5, "silu_mul") in epilogues and (1, "silu_mul") not in epilogues


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])  # qkv without and with a bias
def test_rope_in_qkv_gives_the_reference_logits(monkeypatch, preset):
    """BLINK_QKV_ROPE's path (FusionPolicy.rope_in_qkv): decode steps run qkv with RoPE and the KV write in its
    epilogue (gemv_rope.py: one row on the CUDA-core loop, more on tensor cores) and skip rope_and_write_kv; the
    logits stay the cuBLAS path's, and the prefill (above max_m) takes the old path in the same run."""
    model, _ = load_model(preset, "cpu", dtype=torch.float32, seed=2)
    chunks = [{0: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}, {0: [11], 1: [12, 13, 14]}, {0: [15], 1: [16]}, {0: [17]},
              {1: [18]}]
    pads = [1, 1, 1, 1, 0]  # the last step has one row: no padding row
    reference = PagedDriver(model)
    expected = [reference.step(c, pad_tokens=p, pad_seqs=p) for c, p in zip(chunks, pads, strict=True)]
    fused_rows = []
    real = kernels.gemv_rope_kv_triton

    def spy(*a, **k):
        fused_rows.append(a[0].shape[0])
        return real(*a, **k)
    monkeypatch.setattr(kernels, "gemv_rope_kv_triton", spy)
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)
    monkeypatch.setattr(gemv, "default_config",  # head_dim 16: tiles of 16 columns (8 rotate-half pairs)
                        lambda n, k, m=1, prologue="none", epilogue="none":
                        GemvConfig(block_n=16, block_k=32, dot=m > 1 or epilogue != "none"))
    apply_fusion_policy(model, dataclasses.replace(FusionPolicy.parse("all", 8), rope_in_qkv=True))
    assert model.model.layers[0].self_attn.qkv_proj.gemv.rope_kv
    assert not model.model.layers[0].self_attn.o_proj.gemv.rope_kv
    driver = PagedDriver(model)
    for step, (c, p) in enumerate(zip(chunks, pads, strict=True)):
        got = driver.step(c, pad_tokens=p, pad_seqs=p)
        for seq in c:
            torch.testing.assert_close(got[seq], expected[step][seq], rtol=1e-4, atol=1e-4)
    layers = len(model.model.layers)
    # 5, 3 and 2 rows with the padding row, then 1 without (each layer once); the 11-row prefill is above max_m: the
    # old path
    assert fused_rows == [5] * layers + [3] * layers + [2] * layers + [1] * layers


def test_rope_in_qkv_setting(monkeypatch):
    from blink.model.fusion import policy_from_env

    monkeypatch.delenv("BLINK_QKV_ROPE", raising=False)
    assert policy_from_env().rope_in_qkv  # the default since session 28
    monkeypatch.setenv("BLINK_QKV_ROPE", "0")
    assert not policy_from_env().rope_in_qkv
    monkeypatch.setenv("BLINK_QKV_ROPE", "yes")
    with pytest.raises(ValueError, match="BLINK_QKV_ROPE"):
        policy_from_env()


def test_plan_max_m_sends_larger_calls_to_cublas(monkeypatch):
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)
    monkeypatch.setattr(kernels, "gemv_triton", lambda *a, **k: pytest.fail("GEMV called above max_m"))
    x, weight = torch.randn(3, 64), torch.randn(16, 64)
    out = kernels.linear(x, weight, gemv=GemvPlan(GemvConfig(block_n=4, block_k=64), max_m=2))
    torch.testing.assert_close(out, x @ weight.T)


def test_pdl_only_on_cuda_tensors_when_on():
    from blink.kernels.pdl import pdl_for, pdl_switched

    with pdl_switched(True):
        assert not pdl_for(torch.zeros(1))  # CPU (and the interpreter): plain launches


def test_default_policy_is_the_gemv_up_to_16_rows_on_one_rank_only(monkeypatch):
    """Unset: every projection up to 16 rows on one rank (measured on the H200) with RoPE in qkv, none when sharded;
    set: as given."""
    from blink.model.fusion import PROJECTIONS, policy_from_env

    monkeypatch.delenv("BLINK_GEMV", raising=False)
    monkeypatch.delenv("BLINK_GEMV_MAX_M", raising=False)
    monkeypatch.delenv("BLINK_QKV_ROPE", raising=False)
    monkeypatch.delenv("BLINK_MOE_GEMV", raising=False)
    assert policy_from_env() == FusionPolicy(frozenset(PROJECTIONS), 16, rope_in_qkv=True, moe_gemv_pairs=None)
    assert policy_from_env(tp_size=2).gemv == frozenset()
    monkeypatch.setenv("BLINK_GEMV", "")
    assert policy_from_env().gemv == frozenset()
    monkeypatch.setenv("BLINK_GEMV", "qkv,o")
    monkeypatch.setenv("BLINK_GEMV_MAX_M", "4")
    assert policy_from_env() == FusionPolicy(frozenset({"qkv", "o"}), 4, rope_in_qkv=True, moe_gemv_pairs=None)


def test_pdl_is_on_by_default_the_samplers_for_one_row_and_both_switch_back(monkeypatch):
    from blink.kernels import pdl

    assert pdl._state["model"] is (os.environ.get("BLINK_PDL", "1") == "1")
    assert pdl._state["sampler"] == pdl._SAMPLER_ENV[os.environ.get("BLINK_SAMPLER_PDL", "one_row")]
    monkeypatch.setattr(pdl, "_state", {"model": True, "sampler": "one_row"})
    monkeypatch.setattr(pdl, "pdl_for", lambda t: True)  # as on a Hopper GPU
    assert pdl.sampler_pdl_for(torch.zeros(1, 8)) and not pdl.sampler_pdl_for(torch.zeros(2, 8))
    monkeypatch.setattr(pdl, "_state", {"model": True, "sampler": True})
    assert pdl.sampler_pdl_for(torch.zeros(2, 8))
    monkeypatch.setenv("BLINK_SAMPLER_PDL", "yes")
    with pytest.raises(ValueError, match="BLINK_SAMPLER_PDL"):
        pdl._sampler_setting()
    monkeypatch.undo()
    for part in ("model", "sampler"):
        before = pdl._state[part]
        with pdl.pdl_switched(not before, part):
            assert pdl._state[part] is (not before)
        assert pdl._state[part] is before
    with pdl.pdl_switched(True, "sampler"):
        assert not pdl.sampler_pdl_for(torch.zeros(1, 8))  # CPU (and the interpreter): plain launches
