"""Host engine on the GPU with CUDA graphs: parity with HF (fp32, TF32 off) and with its own eager path."""
import numpy as np
import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model
from tests.host.test_host_engine import hf_greedy, run_all

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_tf32")]


def test_graphs_greedy_match_hf_fp32(tmp_path):
    path = make_tiny_model(tmp_path, "llama")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 500, n).tolist() for n in (1, 5, 17, 40, 64, 3, 100, 9)]
    eng = HostEngine(EngineArgs(model=str(path), device="cuda", dtype="float32", max_num_seqs=8,
                                max_num_batched_tokens=32, num_kv_blocks=14, block_size=16))
    assert eng.runner.graphs, "graphs should be captured on the GPU"
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    tokens, _, _ = run_all(eng, {i: (q, p) for i, q in enumerate(prompts)})
    for i, q in enumerate(prompts):
        assert tokens[i] == hf_greedy(path, q, 16), f"request {i}"
    assert eng.stats().preemptions > 0


LLAMA3_8B_4L = dict(model="llama3-8b", device="cuda", dtype="bfloat16", max_num_seqs=32, max_num_batched_tokens=512,
                   max_model_len=1024, num_kv_blocks=2048)


def llama3_8b_4l_workload() -> tuple[LoadedModel, dict]:
    """llama3-8b's shape cut to 4 layers (bf16), and 24 greedy requests of 1-299 random tokens, 24 out each:
    the graphs-vs-eager workload (tests/model/test_fusion_gpu.py runs it with the fusion levers on too)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 128000, int(n)).tolist() for n in rng.integers(1, 300, 24)]
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return LoadedModel.load(EngineArgs(**LLAMA3_8B_4L), num_layers=4), {i: (q, p) for i, q in enumerate(prompts)}


def eager_run(loaded: LoadedModel, requests: dict, padded: bool) -> dict:
    """The workload eagerly, padded to the graphs' buckets (the runner's default on a GPU) or at the exact shape."""
    engine = HostEngine(EngineArgs(**LLAMA3_8B_4L, enforce_eager=True), loaded)
    engine.runner.pad_to_buckets = padded
    return run_all(engine, requests)[0]


def eager_runs(loaded: LoadedModel, requests: dict) -> tuple[dict, dict]:
    """eager_run padded and exact."""
    return eager_run(loaded, requests, padded=True), eager_run(loaded, requests, padded=False)


def identical(a: dict, b: dict) -> int:
    return sum(a[i] == b[i] for i in a)


def test_llama3_8b_shape_bf16_graphs_vs_eager():
    loaded, requests = llama3_8b_4l_workload()
    graphs, _, _ = run_all(HostEngine(EngineArgs(**LLAMA3_8B_4L), loaded), requests)
    padded, exact = eager_runs(loaded, requests)
    print(f"llama3-8b (4 layers) bf16: {identical(graphs, padded)}/{len(requests)} requests identical between graphs "
          f"and eager at the buckets' shapes, {identical(graphs, exact)}/{len(requests)} with eager at exact shapes")
    # The same kernels at the same shapes; cuBLAS may still pick another algorithm inside a capture (23/24 on
    # 2026-12-02 with eager unpadded, the floor issue 17 keeps).
    assert identical(graphs, padded) >= len(requests) - 1
    # At exact shapes bf16 rounding differs with the padded bucket: a loose check of the first tokens only.
    assert sum(graphs[i][0] == exact[i][0] for i in requests) >= len(requests) * 0.75
