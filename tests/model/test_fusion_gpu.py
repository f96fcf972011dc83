"""Issue 17's levers on the GPU (needs a CUDA GPU): the GEMV and its prologues on llama3-8b's shapes in bf16,
PDL inside captured graphs, and graphs against eager with every lever on."""
import dataclasses

import pytest
import torch

from bench.kernels.step_kernels import _decode_step
from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.kernels import gemv
from blink.kernels.pdl import pdl_switched
from blink.model import presets
from blink.model.fusion import FusionPolicy, apply_fusion_policy
from blink.model.llama import LlamaForCausalLM
from blink.model.weights import init_preset_weights
from tests.host.test_host_engine import run_all
from tests.host.test_host_engine_gpu import LLAMA3_8B_4L, eager_runs, identical, llama3_8b_4l_workload

pytestmark = pytest.mark.gpu
# (K, N) of llama3-8b's projection each prologue stands in front of
SHAPES = {"none": (4096, 128256), "norm": (4096, 6144), "add_norm": (4096, 28672), "silu_mul": (14336, 4096)}


@pytest.fixture
def pdl():
    with pdl_switched(True):
        yield


def _rel(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _same_choice(got, ref, tol=2e-2):
    """Each row's greedy token under ref is (up to a near-tie of tol x max|logit|) the best under got too."""
    picked = got.gather(-1, ref.argmax(-1, keepdim=True)).squeeze(-1)
    return bool((picked >= got.max(-1).values - tol * got.abs().max()).all())


@pytest.mark.parametrize("prologue", list(gemv.PROLOGUES))
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16, 33, 64])
def test_gemv_real_shapes_bf16(prologue, m, pdl):
    k, n = SHAPES[prologue]
    gen = torch.Generator(device="cuda").manual_seed(m)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).bfloat16()
    x = rand(m, 2 * k if prologue == "silu_mul" else k)
    weight, bias = rand(n, k) / k**0.5, rand(n) if m == 5 else None
    norm_w = rand(k) if prologue in ("norm", "add_norm") else None
    residual = rand(m, k) if prologue == "add_norm" else None
    poison = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    del poison  # the output reuses the NaN block: every element must be written
    got = gemv.gemv_triton(x, weight, bias, prologue, norm_w, 1e-5, residual)
    ref = gemv.gemv_ref(x, weight, bias, prologue, norm_w, 1e-5, residual)
    if prologue == "add_norm":
        assert torch.equal(got[1], ref[1])  # the new residual: one bf16 add, rounded the same
        got, ref = got[0], ref[0]
    assert torch.isfinite(got).all()
    assert _rel(got, ref) < 1e-2


@pytest.mark.parametrize("prologue", ["add_norm", "norm"])
@pytest.mark.parametrize("m", [2, 8, 16, 32, 64])
def test_gate_up_with_the_silu_epilogue_real_shapes_bf16(prologue, m, pdl):
    """llama3-8b's gate|up [2 x 14336, 4096] with the one-pass norm and silu(gate) * up in the epilogue, against
    norm + GEMM + SiLU-mul in bf16 (the norm rounds s * g where the kernel rounds s * rstd)."""
    k, n = 4096, 2 * 14336
    gen = torch.Generator(device="cuda").manual_seed(m)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).bfloat16()
    x, weight, norm_w = rand(m, k), rand(n, k) / k**0.5, rand(k)
    residual = rand(m, k) if prologue == "add_norm" else None
    got = gemv.gemv_triton(x, weight, None, prologue, norm_w, 1e-5, residual, epilogue="silu_mul")
    ref = gemv.gemv_ref(x, weight, None, prologue, norm_w, 1e-5, residual, epilogue="silu_mul")
    if prologue == "add_norm":
        assert torch.equal(got[1], ref[1])
        got, ref = got[0], ref[0]
    assert got.shape == (m, n // 2) and torch.isfinite(got).all()
    assert _rel(got, ref) < 1e-2


def _short_llama(layers=4):
    cfg = dataclasses.replace(presets.get("llama3-8b"), num_hidden_layers=layers)
    model = LlamaForCausalLM(cfg, "cuda", torch.bfloat16, max_positions=2048)
    init_preset_weights(model, seed=0)
    return model, cfg


@pytest.mark.parametrize("m", [1, 2, 8, 16])
def test_qkv_with_rope_and_kv_write_real_shapes_bf16(m, pdl):
    """llama3-8b's qkv with RoPE and the KV write in the epilogue (gemv_rope.py, default tiles: one row on the
    CUDA-core loop) against the GEMV's reference, then rope_and_write_kv's, in bf16: qkv and both caches, a padding
    row (slot -1) left out from two rows on."""
    from blink.kernels.gemv_rope import gemv_rope_kv_ref, gemv_rope_kv_triton

    hq, hkv, d, k = 32, 8, 128, 4096
    gen = torch.Generator(device="cuda").manual_seed(m)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).bfloat16()
    angles = torch.rand(8192, d // 2, device="cuda", generator=gen) * 6.3
    slots = torch.randperm(4 * m * 16, device="cuda", generator=gen)[:m]
    if m > 1:
        slots[-1] = -1
    case = dict(x=rand(m, k), weight=rand((hq + 2 * hkv) * d, k) / k**0.5, bias=None, prologue="add_norm",
                norm_weight=rand(k), eps=1e-5, residual=rand(m, k),
                positions=torch.randint(0, 8192, (m,), device="cuda"),
                cos_sin=torch.cat((angles.cos(), angles.sin()), dim=-1), k_cache=rand(4 * m, 16, hkv, d),
                v_cache=rand(4 * m, 16, hkv, d), slot_mapping=slots, num_q_heads=hq, num_kv_heads=hkv)
    mine = {key: v.clone() if isinstance(v, torch.Tensor) else v for key, v in case.items()}
    config = gemv.default_config(mine["weight"].shape[0], k, m, "add_norm")
    got, got_residual = gemv_rope_kv_triton(**mine, config=config)
    ref, ref_residual = gemv_rope_kv_ref(**case)
    assert torch.equal(got_residual, ref_residual)
    assert _rel(got, ref) < 1e-2
    assert _rel(mine["k_cache"], case["k_cache"]) < 1e-2 and _rel(mine["v_cache"], case["v_cache"]) < 1e-2


@pytest.mark.parametrize("rope_in_qkv", [False, True])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_step_graph_with_levers_matches_eager_and_the_baseline(batch, rope_in_qkv):
    """A decode step (GEMV at every batch here, PDL) captured and replayed equals its eager run; and the logits stay
    those of the unfused cuBLAS path up to bf16 accumulation order."""
    model, cfg = _short_llama()
    step = _decode_step(model, cfg, batch, 1000, 2048)
    with torch.inference_mode():
        apply_fusion_policy(model, FusionPolicy())  # the unfused cuBLAS path, whatever the default is
        with pdl_switched(False):
            baseline = step().float()
        apply_fusion_policy(model, dataclasses.replace(FusionPolicy.parse("all"), rope_in_qkv=rope_in_qkv))
        with pdl_switched(True):
            eager = step().float()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = step()
            # Replay on other tokens: a kernel that read its input before the previous kernel wrote it
            # would see the capture's values, not these.
            step.input_ids.copy_(torch.randint_like(step.input_ids, cfg.vocab_size))
            graph.replay()
            torch.cuda.synchronize()
            replayed = captured.float()
            eager_new = step().float()
    assert torch.isfinite(replayed).all()
    assert _rel(replayed, eager_new) < 1e-2  # the same kernels; only cuBLAS may pick another algorithm in capture
    assert _same_choice(replayed, eager_new)
    assert _rel(eager, baseline) < 3e-2
    assert _same_choice(eager, baseline)


def test_host_engine_graphs_vs_eager_with_every_lever_on():
    """As tests/host/test_host_engine_gpu.py's graphs-vs-eager check, with the GEMV on every projection and PDL."""
    args = LLAMA3_8B_4L
    loaded, requests = llama3_8b_4l_workload()
    prompts = [q for q, _ in requests.values()]
    apply_fusion_policy(loaded.model, FusionPolicy())  # the unfused graphs, whatever the default is
    with pdl_switched(False):
        baseline, _, _ = run_all(HostEngine(EngineArgs(**args), loaded), requests)
    taken = apply_fusion_policy(loaded.model, FusionPolicy.parse("all"))
    assert taken == {"qkv": 4, "o": 4, "gate_up": 4, "down": 4, "lm_head": 1}
    with pdl_switched(True):
        graphs, _, _ = run_all(HostEngine(EngineArgs(**args), loaded), requests)
        padded, exact = eager_runs(loaded, requests)
    print(f"llama3-8b (4 layers) bf16, GEMV + PDL: {identical(graphs, padded)}/{len(prompts)} requests identical "
          f"between graphs and eager at the buckets' shapes ({identical(graphs, exact)} at exact shapes), "
          f"{identical(graphs, baseline)}/{len(prompts)} identical to the unfused graphs")
    assert identical(graphs, padded) >= len(prompts) - 1  # as tests/host/test_host_engine_gpu.py
    assert sum(graphs[i][0] == baseline[i][0] for i in range(len(prompts))) >= len(prompts) * 0.75
