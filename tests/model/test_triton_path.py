"""The model over the Triton kernels (run by Triton's CPU interpreter here) gives the reference's logits.

On the GPU the dispatcher picks the Triton kernels; this checks on the CPU that the model hands them
tensors they accept (strided q/k/v views of the fused qkv output, per-head q/k norm, padding).
"""
from __future__ import annotations

import os

import pytest
import torch

from blink import kernels
from blink.model import layers, llama
from blink.model.weights import load_model
from tests.model.paged import PagedDriver

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs the Triton interpreter or a GPU")


def use_triton_kernels(monkeypatch) -> None:
    for module in (llama, layers, kernels):  # kernels: its norm_linear and linear call them by name
        for name in ("write_kv", "paged_attention", "rms_norm", "apply_rope", "silu_and_mul"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(kernels, f"{name}_triton"))


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen2"])
def test_triton_kernels_match_reference(monkeypatch, preset):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_model(preset, device, dtype=torch.float32, seed=1)
    chunks = [{0: [1, 2, 3, 4, 5], 1: [6]}, {0: [7], 1: [8, 9]}]
    reference = PagedDriver(model)
    expected = [reference.step(c, pad_tokens=2, pad_seqs=1) for c in chunks]
    use_triton_kernels(monkeypatch)
    triton_driver = PagedDriver(model)
    for step, c in enumerate(chunks):
        got = triton_driver.step(c, pad_tokens=2, pad_seqs=1)
        for seq in c:
            torch.testing.assert_close(got[seq], expected[step][seq], rtol=1e-4, atol=1e-4)
