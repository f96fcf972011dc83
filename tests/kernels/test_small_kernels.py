"""write_kv, rms_norm, apply_rope, silu_and_mul: references vs plain formulas, Triton vs references."""
import pytest
import torch
import torch.nn.functional as F

from blink.kernels.activation import silu_and_mul_ref, silu_and_mul_triton
from blink.kernels.kv_write import write_kv_ref, write_kv_triton
from blink.kernels.rmsnorm import rms_norm_ref, rms_norm_triton
from blink.kernels.rope import apply_rope_ref, apply_rope_triton


def _tolerances(dtype) -> dict:
    """fp32: tight. bf16: two ulps, since the interpreter truncates fp32 -> bf16 where torch rounds."""
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=2**-6)


def _fused_qkv(tokens, num_q_heads, num_kv_heads, head_dim, dtype=torch.float32, seed=0):
    """q, k, v as strided views of one [T, (Hq + 2 Hkv) * D] projection output, as the model produces."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    return (q.view(tokens, num_q_heads, head_dim), k.view(tokens, num_kv_heads, head_dim),
            v.view(tokens, num_kv_heads, head_dim))


@pytest.mark.parametrize("impl", [write_kv_ref, write_kv_triton])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 48), (1, 128), (3, 16)])
def test_write_kv_scatters_and_skips_padding(impl, num_kv_heads, head_dim):
    _, k, v = _fused_qkv(5, 2, num_kv_heads, head_dim)
    block_size, num_blocks = 4, 6
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, 7.0), torch.full(shape, 7.0)
    slot_mapping = torch.tensor([9, -1, 0, 23, 14], dtype=torch.int64)
    impl(k, v, k_cache, v_cache, slot_mapping)
    flat_k, flat_v = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], k[token]) and torch.equal(flat_v[slot], v[token])
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[[9, 0, 23, 14]] = False
    assert (flat_k[untouched] == 7.0).all() and (flat_v[untouched] == 7.0).all()


def test_write_kv_casts_to_cache_dtype():
    _, k, v = _fused_qkv(3, 2, 2, 16)
    caches = [torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16) for _ in range(4)]
    slots = torch.tensor([1, 6, -1])
    write_kv_ref(k, v, caches[0], caches[1], slots)
    write_kv_triton(k, v, caches[2], caches[3], slots)
    # The interpreter truncates fp32 -> bf16 where torch rounds to nearest: allow one bf16 ulp.
    torch.testing.assert_close(caches[2], caches[0], atol=0, rtol=2**-7)
    torch.testing.assert_close(caches[3], caches[1], atol=0, rtol=2**-7)


def _hf_rms_norm(x, weight, eps):
    """Transformers' LlamaRMSNorm / Qwen3RMSNorm forward."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [48, 128, 200])
def test_rms_norm(dtype, hidden):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(7, hidden, generator=gen) * 3).to(dtype)
    weight = torch.randn(hidden, generator=gen).to(dtype)
    expected = _hf_rms_norm(x, weight, 1e-6)
    assert torch.equal(rms_norm_ref(x, weight, 1e-6), expected)
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), expected, **_tolerances(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_fused_residual(dtype):
    gen = torch.Generator().manual_seed(2)
    x, residual = (torch.randn(5, 64, generator=gen).to(dtype) for _ in range(2))
    weight = torch.randn(64, generator=gen).to(dtype)
    summed = x + residual  # HF adds in the model dtype, then normalizes
    for impl in (rms_norm_ref, rms_norm_triton):
        out, new_residual = impl(x, weight, 1e-5, residual)
        torch.testing.assert_close(new_residual, summed, **_tolerances(dtype))
        torch.testing.assert_close(out, _hf_rms_norm(summed, weight, 1e-5), **_tolerances(dtype))
    assert torch.equal(rms_norm_ref(x, weight, 1e-5, residual)[1], summed)


def test_rms_norm_per_head_on_strided_view():
    """Qwen3's q_norm/k_norm: normalize each head of a q slice of the fused qkv output."""
    q, k, _ = _fused_qkv(6, 4, 2, 48)
    weight = torch.randn(48)
    for x in (q, k):
        expected = _hf_rms_norm(x, weight, 1e-6)
        torch.testing.assert_close(rms_norm_ref(x, weight, 1e-6), expected)
        torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), expected, atol=1e-5, rtol=1e-5)


def _cos_sin(max_pos, head_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _hf_rope(x, positions, cos_sin):
    """Transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin with duplicated frequencies."""
    half = x.shape[-1] // 2
    cos = cos_sin[positions, :half].repeat(1, 2)[:, None, :]
    sin = cos_sin[positions, half:].repeat(1, 2)[:, None, :]
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x.float() * cos + rotated.float() * sin


@pytest.mark.parametrize("heads,head_dim", [((4, 2), 48), ((8, 1), 128), ((3, 3), 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope(heads, head_dim, dtype):
    cos_sin = _cos_sin(64, head_dim)
    positions = torch.tensor([0, 5, 63, 17, 1], dtype=torch.int64)
    q, k, _ = _fused_qkv(5, *heads, head_dim, dtype)
    expected_q, expected_k = _hf_rope(q, positions, cos_sin), _hf_rope(k, positions, cos_sin)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for impl in (apply_rope_ref, apply_rope_triton):
        q_in, k_in, _ = _fused_qkv(5, *heads, head_dim, dtype)
        q_out, k_out = impl(q_in, k_in, positions, cos_sin)
        assert q_out.data_ptr() == q_in.data_ptr()  # in place
        torch.testing.assert_close(q_out.float(), expected_q, atol=tol, rtol=tol)
        torch.testing.assert_close(k_out.float(), expected_k, atol=tol, rtol=tol)


@pytest.mark.parametrize("inter", [48, 1000, 2100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(inter, dtype):
    x = torch.randn(3, 2 * inter, generator=torch.Generator().manual_seed(3)).to(dtype)
    expected = F.silu(x[:, :inter].float()) * x[:, inter:].float()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(silu_and_mul_ref(x).float(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(silu_and_mul_triton(x).float(), expected, atol=tol, rtol=tol)
