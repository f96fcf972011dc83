"""The one-shot peer-to-peer all-reduces (push and LL) against NCCL on two GPUs, through `blink bench
allreduce`: the same sums (within one bf16 step) for decode- and prefill-sized tensors, including sizes
that are not a multiple of the block's work, and a time for each."""
from __future__ import annotations

import json

import pytest
import torch

from blink.bench.cli import main

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def test_p2p_allreduce_matches_nccl(tmp_path):
    out = tmp_path / "allreduce.json"
    assert main(["allreduce", "--tokens", "1,3,64", "--hidden", "4104", "--iters", "5", "--replays", "3",
                 "--world", "2", "--result-json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["elements"] for r in rows] == [4104, 3 * 4104, 64 * 4104]
    for r in rows:
        assert r["max_abs_diff"] <= 0.0625, r  # randn sums stay below 8, where one bf16 step is 0.0625
        assert r["nccl_us"] > 0 and r["push_us"] > 0 and r["ll_us"] > 0
