"""rope_and_write_kv (fused q/k norm + RoPE + KV write) against the composed references, alone and in the model."""
import pytest
import torch

from blink.kernels.rope import rope_and_write_kv_ref, rope_and_write_kv_triton
from blink.model import llama
from tests.model.paged import PagedDriver


def _fused_qkv(tokens, num_q_heads, num_kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=gen) * 2).to(dtype)
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    return qkv, (q.view(tokens, num_q_heads, head_dim), k.view(tokens, num_kv_heads, head_dim),
                 v.view(tokens, num_kv_heads, head_dim))


def _cos_sin(max_pos, head_dim):
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,head_dim", [((4, 2), 48), ((8, 1), 128), ((3, 3), 16)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_and_write_kv_matches_composed_references(dtype, heads, head_dim, qk_norm):
    num_q_heads, num_kv_heads = heads
    positions = torch.tensor([0, 5, 63, 17, 1, 200], dtype=torch.int64)  # 200: clamped (padding)
    slots = torch.tensor([9, 0, 23, 14, 3, -1], dtype=torch.int64)
    gen = torch.Generator().manual_seed(5)
    weights = ((torch.randn(head_dim, generator=gen).to(dtype), torch.randn(head_dim, generator=gen).to(dtype))
               if qk_norm else (None, None))
    results = []
    for impl in (rope_and_write_kv_ref, rope_and_write_kv_triton):
        qkv, (q, k, v) = _fused_qkv(6, num_q_heads, num_kv_heads, head_dim, dtype)
        caches = [torch.full((6, 4, num_kv_heads, head_dim), 7.0, dtype=dtype) for _ in range(2)]
        q_out, k_out = impl(q, k, v, positions, _cos_sin(64, head_dim), *caches, slots, *weights, 1e-6)
        assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()  # in place
        results.append((qkv, *caches))
    # bf16: the interpreter truncates fp32 -> bf16 where torch rounds (at three points with the norm).
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2**-5)
    for got, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, expected, **tol)
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[[9, 0, 23, 14, 3]] = False
    assert (results[1][1].view(24, -1)[untouched] == 7.0).all()  # the padding token wrote nothing


def test_rope_and_write_kv_in_the_model_matches_the_reference(monkeypatch):
    """Qwen3 (q/k norm) and Qwen2 through the fused Triton kernel give the reference path's logits."""
    from blink.model.weights import load_model

    for preset in ("tiny-qwen3", "tiny-qwen2"):
        model, _ = load_model(preset, "cpu", dtype=torch.float32, seed=1)
        chunks = [{0: [1, 2, 3, 4, 5], 1: [6]}, {0: [7], 1: [8, 9]}]
        reference = PagedDriver(model)
        expected = [reference.step(c, pad_tokens=2, pad_seqs=1) for c in chunks]
        with monkeypatch.context() as patch:
            patch.setattr(llama, "rope_and_write_kv", rope_and_write_kv_triton)
            driver = PagedDriver(model)
            for step, c in enumerate(chunks):
                got = driver.step(c, pad_tokens=2, pad_seqs=1)
                for seq in c:
                    torch.testing.assert_close(got[seq], expected[step][seq], rtol=1e-4, atol=1e-4)
