"""The Triton kernels on real shapes in bf16 against their references (needs a CUDA GPU)."""
import pytest
import torch

from blink.kernels import apply_rope, paged_attention, rms_norm, silu_and_mul, write_kv
from blink.kernels.activation import silu_and_mul_ref
from blink.kernels.attention import default_tuning_switched, paged_attention_ref, paged_attention_triton
from blink.kernels.attention_merge import split_tickets
from blink.kernels.attention_plan import AttentionTuning
from blink.kernels.kv_write import write_kv_ref
from blink.kernels.rmsnorm import rms_norm_ref
from blink.kernels.rope import apply_rope_ref, rope_and_write_kv_ref, rope_and_write_kv_triton
from tests.kernels.paged_batch import make_paged_batch

pytestmark = pytest.mark.gpu
IN_KERNEL = AttentionTuning(merge_in_kernel=True)  # the KV splits merged by the last split (attention_merge.py)
BF16_TOL = dict(atol=2e-2, rtol=2e-2)


def _poison_allocator(shape, dtype):
    """Leave a NaN-filled block in the caching allocator so the kernel's output reuses it."""
    poison = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del poison


def _attention_case(q_lens, seq_lens, heads=(32, 8), head_dim=128, pad_seqs=0, pad_tokens=0, splits=None):
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=head_dim, block_size=16,
                             dtype=torch.bfloat16, device="cuda", pad_seqs=pad_seqs, pad_tokens=pad_tokens)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
            head_dim**-0.5)
    expected = paged_attention_ref(*args)
    n = batch.num_real_tokens
    # the split merge by a second kernel, then by the last split (attention_merge.py), twice on the same tickets
    tickets = split_tickets(batch.q.shape[0] + len(seq_lens) + pad_seqs, heads[1], "cuda")
    for merge_tickets in (None, tickets, tickets):
        _poison_allocator(batch.q.shape, batch.q.dtype)
        out = paged_attention_triton(*args, num_splits=splits, split_tickets=merge_tickets, tuning=IN_KERNEL)
        assert torch.isfinite(out[:n]).all(), "some output element was not written"
        torch.testing.assert_close(out[:n], expected[:n], **BF16_TOL)
        assert not tickets.any()


def test_attention_decode_batch_64():
    gen = torch.Generator().manual_seed(0)
    seq_lens = torch.randint(1, 4097, (64,), generator=gen).tolist()
    _attention_case([1] * 64, seq_lens, pad_seqs=3, pad_tokens=3)


@pytest.mark.parametrize("seq_len", [1, 37, 4096])
def test_attention_single_decode_split_kv(seq_len):
    _attention_case([1], [seq_len])


def test_attention_prefill_2k():
    _attention_case([2048], [2048])


def test_attention_mixed_batch():
    q_lens = [512, 333, 1] + [1] * 40
    seq_lens = [1512, 333, 4000] + [int(x) for x in torch.randint(1, 3000, (40,)).tolist()]
    _attention_case(q_lens, seq_lens, pad_seqs=5, pad_tokens=21)


@pytest.mark.parametrize("heads", [(8, 8), (16, 8), (32, 8), (64, 8), (28, 4)])
@pytest.mark.parametrize("head_dim", [48, 64, 80, 96, 128])
@pytest.mark.parametrize("splits", [None, 4])
def test_attention_group_ratios_and_head_dims(heads, head_dim, splits):
    _attention_case([7, 1, 100, 1], [7, 300, 160, 1025], heads=heads, head_dim=head_dim, pad_seqs=1,
                    pad_tokens=2, splits=splits)


def test_attention_cuda_graph_replay_with_new_contents():
    """Grid depends only on T and S: one capture serves any batch of that bucket."""
    num_tokens, num_seqs = 48, 8
    first = make_paged_batch([20, 1, 1, 5, 1], [20, 900, 30, 105, 2], 32, 8, 128, 16, torch.bfloat16, "cuda",
                             pad_seqs=3, pad_tokens=20, max_blocks=256, seed=1)
    second = make_paged_batch([1] * 6 + [40], [4000, 1, 17, 33, 64, 2048, 40], 32, 8, 128, 16,
                              torch.bfloat16, "cuda", pad_seqs=1, pad_tokens=2, max_blocks=256, seed=2)
    fields = ("q", "k_cache", "v_cache", "query_start_loc", "seq_lens", "block_tables")
    static = {name: getattr(first, name).clone() for name in fields}
    assert static["q"].shape[0] == num_tokens and static["seq_lens"].shape[0] == num_seqs
    static["k_cache"] = torch.zeros_like(second.k_cache)  # large enough for both batches' blocks
    static["v_cache"] = torch.zeros_like(second.v_cache)
    tickets = split_tickets(num_tokens + num_seqs, 8, "cuda")  # the last split merges (attention_merge.py)
    run = lambda: paged_attention(*(static[name] for name in fields), 128**-0.5, tickets)
    stream = torch.cuda.Stream()
    with default_tuning_switched(IN_KERNEL):  # captured with it
        with torch.cuda.stream(stream):
            run()  # compile outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
    for batch in (first, second):
        for name in fields:
            src = getattr(batch, name)
            static[name].zero_()
            static[name][tuple(slice(0, n) for n in src.shape)].copy_(src)
        graph.replay()
        expected = paged_attention_ref(*(static[name] for name in fields), 128**-0.5)
        n = batch.num_real_tokens
        torch.testing.assert_close(out[:n], expected[:n], **BF16_TOL)


@pytest.mark.parametrize("merge_in_kernel", [False, True])
@pytest.mark.parametrize("seq_lens", [[1000], [1, 64, 65, 2000]])
def test_split_attention_after_rope_in_a_graph_with_pdl(seq_lens, merge_in_kernel):
    """The model's order on llama3-8b's heads, 8 layers in one captured graph with PDL (the default): rope and
    the KV write of this step's token, then split-KV attention and its merge. The new token's slot holds NaN
    until the rope kernel writes it, so an attention that read it before its PDL wait would poison the output.
    Replayed twice on new q/k/v."""
    from blink.kernels.pdl import pdl_switched
    from blink.model import presets
    from blink.model.config import ModelConfig
    from blink.model.rope import rope_cos_sin

    layers, hq, hkv, d = 8, 32, 8, 128
    batches = [make_paged_batch([1] * len(seq_lens), seq_lens, hq, hkv, d, 16, torch.bfloat16, "cuda", seed=i)
               for i in range(layers)]
    b0 = batches[0]  # its block tables serve every layer (each layer has its own cache)
    cos_sin = rope_cos_sin(ModelConfig.from_hf_dict(presets.PRESETS["llama3-8b"]), 4096, "cuda")
    positions = (b0.seq_lens.long() - 1).cuda()
    last_block = b0.block_tables.gather(1, (positions // 16)[:, None].int()).squeeze(1).long()
    slots = last_block * 16 + positions % 16
    qkv = torch.empty(layers, len(seq_lens), (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    outs = []
    tickets = split_tickets(2 * len(seq_lens), hkv, "cuda") if merge_in_kernel else None  # every layer's, as the runner

    def step():
        outs.clear()
        for i, batch in enumerate(batches):
            q, k, v = qkv[i].split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k = rope_and_write_kv_triton(q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d), positions,
                                            cos_sin, batch.k_cache, batch.v_cache, slots)
            outs.append(paged_attention_triton(q, batch.k_cache, batch.v_cache, b0.query_start_loc, b0.seq_lens,
                                               b0.block_tables, d**-0.5, split_tickets=tickets, tuning=IN_KERNEL))

    with pdl_switched(True):
        qkv.normal_()
        step()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    for seed in (1, 2):
        torch.manual_seed(seed)
        qkv.normal_()
        qkv_before = qkv.clone()  # the graph ropes q and k in place
        caches = []
        for batch in batches:
            for cache in (batch.k_cache, batch.v_cache):
                cache.view(-1, hkv, d)[slots] = float("nan")  # the new token's slot before this step writes it
            caches.append((batch.k_cache.clone(), batch.v_cache.clone()))
        graph.replay()
        torch.cuda.synchronize()
        for i, (k_cache, v_cache) in enumerate(caches):
            q, k, v = qkv_before[i].split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k = rope_and_write_kv_ref(q.reshape(-1, hq, d), k.reshape(-1, hkv, d), v.reshape(-1, hkv, d),
                                         positions, cos_sin, k_cache, v_cache, slots)
            expected = paged_attention_ref(q, k_cache, v_cache, b0.query_start_loc, b0.seq_lens, b0.block_tables,
                                           d**-0.5)
            assert torch.isfinite(outs[i]).all(), f"layer {i}: the new token's stale slot was read"
            torch.testing.assert_close(outs[i], expected, **BF16_TOL)
        assert tickets is None or not tickets.any()


def test_write_kv_real_shapes():
    tokens, heads, dim = 512, 8, 128
    qkv = torch.randn(tokens, (32 + 2 * heads) * dim, device="cuda", dtype=torch.bfloat16)
    k = qkv[:, 32 * dim : (32 + heads) * dim].view(tokens, heads, dim)
    v = qkv[:, (32 + heads) * dim :].view(tokens, heads, dim)
    slots = torch.randperm(64 * 16, device="cuda")[:tokens]
    slots[::7] = -1
    caches = [torch.randn(64, 16, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    expected = [c.clone() for c in caches]
    write_kv(k, v, *caches, slots)
    write_kv_ref(k, v, *expected, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def close_to_two_ulps(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Only rsqrt (and the mean's summation order) may differ, in the last bit; the normalized value is
    rounded to bf16 before the weight multiply (HF's order), so that bit can flip one rounding and the
    product's another: two ulps at most, and rarely (the first GPU run, 2026-12-01 session 7, had 1 of
    1.2M elements at two ulps)."""
    torch.testing.assert_close(out, expected, atol=0, rtol=2**-6)
    assert (out != expected).float().mean().item() < 1e-2


def test_rms_norm_matches_reference_to_two_ulps():
    x, residual = (torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    close_to_two_ulps(rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    out, new_residual = rms_norm(x, weight, 1e-5, residual)
    expected_out, expected_residual = rms_norm_ref(x, weight, 1e-5, residual)
    assert torch.equal(new_residual, expected_residual)
    close_to_two_ulps(out, expected_out)
    q = torch.randn(300, 48 * 128, device="cuda", dtype=torch.bfloat16)[:, : 32 * 128].view(300, 32, 128)
    q_weight = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    close_to_two_ulps(rms_norm(q, q_weight, 1e-6), rms_norm_ref(q, q_weight, 1e-6))


def test_rope_and_silu_real_shapes():
    tokens = 1000
    qkv = torch.randn(tokens, 48 * 128, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : 32 * 128].view(tokens, 32, 128)
    k = qkv[:, 32 * 128 : 40 * 128].view(tokens, 8, 128)
    angles = torch.rand(8192, 64, device="cuda") * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    q_ref, k_ref = apply_rope_ref(q.clone(), k.clone(), positions, cos_sin)
    apply_rope(q, k, positions, cos_sin)
    torch.testing.assert_close(q, q_ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(k, k_ref, atol=1e-2, rtol=1e-2)
    x = torch.randn(tokens, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_and_write_kv_real_shapes(qk_norm):
    tokens, heads, kv_heads, dim = 300, 32, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    angles = torch.rand(8192, dim // 2, device="cuda") * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    slots = torch.randperm(64 * 16, device="cuda")[:tokens]
    slots[::7] = -1
    norms = [torch.randn(dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)] if qk_norm else [None] * 2
    results = []
    for impl in (rope_and_write_kv_ref, rope_and_write_kv_triton):
        buffer = qkv.clone()
        q, k, v = (t.view(tokens, -1, dim) for t in buffer.split([heads * dim, kv_heads * dim, kv_heads * dim], 1))
        caches = [torch.zeros(64, 16, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        impl(q, k, v, positions, cos_sin, *caches, slots, *norms, 1e-6)
        results.append((buffer, *caches))
    for got, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
