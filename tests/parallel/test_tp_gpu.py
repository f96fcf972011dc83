"""TP=2 on two GPUs: host mode replaying CUDA graphs whose all-reduces / all-gather are captured NCCL
calls, greedy token for token against TP=1."""
from __future__ import annotations

import pytest
import torch

from blink.engine.llm import LLM
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _greedy(path, tp: int) -> list[list[int]]:
    llm = LLM(str(path), device="cuda", engine="host", tensor_parallel_size=tp, num_kv_blocks=64,
              block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    try:
        prompts = [list(range(5, 5 + n)) for n in (3, 17, 40, 9)]
        outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
        return [o.token_ids for o in outs]
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tp2_graphs_match_tp1_greedy(tmp_path, family):
    path = make_tiny_model(tmp_path, family)
    assert _greedy(path, 2) == _greedy(path, 1)
