"""Paged attention: the reference against dense causal attention, the Triton kernel against the reference."""
import pytest
import torch
import triton

from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from tests.kernels.paged_batch import make_paged_batch, naive_attention

# (q_lens, seq_lens): decodes, prefills, chunked prefill continuing a context, odd lengths, block crossings.
MIXED = ([5, 1, 1, 3, 1], [5, 9, 1, 12, 17])


def _run(fn, batch, scale, **kwargs):
    return fn(batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens,
              batch.block_tables, scale, **kwargs)


@pytest.mark.parametrize("q_lens,seq_lens", [([1], [1]), ([7], [7]), ([1, 1], [6, 33]), MIXED])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 1), (6, 2)])
def test_reference_matches_dense_causal_attention(q_lens, seq_lens, heads):
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=16, block_size=4, pad_seqs=1, pad_tokens=2)
    out = _run(paged_attention_ref, batch, 0.25)
    expected = naive_attention(batch, q_lens, 0.25)
    torch.testing.assert_close(out[: batch.num_real_tokens].double(), expected, atol=1e-5, rtol=1e-5)
    assert out[batch.num_real_tokens :].abs().sum() == 0


@pytest.mark.parametrize(
    "q_lens,seq_lens,heads,head_dim,block_size",
    [
        ([1], [1], (2, 2), 48, 4),  # a single token
        ([1, 1, 1], [3, 8, 13], (8, 2), 128, 4),  # decode batch, group 4, crosses blocks
        ([9], [9], (4, 2), 48, 4),  # prefill, odd length, several query tiles
        ([4], [11], (2, 2), 64, 8),  # chunked prefill on top of existing context
        (*MIXED, (8, 1), 48, 4),  # mixed batch, group 8
        (*MIXED, (4, 4), 80, 16),  # mixed batch, no GQA, a block larger than most sequences
        (*MIXED, (7, 1), 64, 4),  # Qwen2.5-7B's group of 7 (padded to 8 rows)
        ([2, 1], [9, 4], (10, 2), 32, 4),  # Qwen2.5-14B's group of 5
    ],
)
@pytest.mark.parametrize("num_splits", [None, 2])
def test_triton_matches_reference(q_lens, seq_lens, heads, head_dim, block_size, num_splits):
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=head_dim, block_size=block_size,
                             pad_seqs=2, pad_tokens=3)
    scale = head_dim**-0.5
    expected = _run(paged_attention_ref, batch, scale)
    out = _run(paged_attention_triton, batch, scale, num_splits=num_splits)
    n = batch.num_real_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("q_lens,pad_seqs,pad_tokens", [
    ([1] * 8, 0, 0),  # a full decode bucket: as many tiles as sequences, none empty
    ([8], 7, 0),  # the same (8, 8) bucket holding one 8-token chunk and 7 padding rows
    ([1, 1, 1, 5], 4, 0),  # the (8, 8) bucket: a 5-token chunk (3 tiles of 2 tokens at group 8) behind 3 decodes
    ([1, 6, 1], 1, 0),  # an (8, 4) bucket: chunk tiles (8 tokens each)
    ([5, 2, 1], 0, 3),  # padding tokens beyond the sequences' (the next bucket up)
])
def test_the_grid_takes_one_tile_a_sequence_plus_one_per_block_of_extra_tokens(q_lens, pad_seqs, pad_tokens):
    """The tile map (attention_plan.py's first_tile) at the bound of its grid: every composition of T tokens over S
    sequences fits S + (T - S) // BLOCK_Q tiles, and a pure decode bucket has no empty program."""
    batch = make_paged_batch(q_lens, [q + 9 for q in q_lens], 8, 1, head_dim=32, block_size=4, pad_seqs=pad_seqs,
                             pad_tokens=pad_tokens)
    tokens, seqs = batch.q.shape[0], len(q_lens) + pad_seqs
    plan = launch_plan(tokens, seqs, 8, 1, 32, 64, AttentionTuning())
    assert plan.num_tiles == seqs + (tokens - seqs) // plan.block_q
    if q_lens == [1] * 8:
        assert plan.num_tiles == 8
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2)
    n = batch.num_real_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_triton_long_context_split_kv(num_splits):
    q_lens, seq_lens = [1, 3], [300, 150]  # many KV tiles so every split gets work; some splits are empty
    batch = make_paged_batch(q_lens, seq_lens, 4, 2, head_dim=32, block_size=16, pad_tokens=1)
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, num_splits=num_splits)
    torch.testing.assert_close(out[:4], expected[:4], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("block_n", [16, 32])
def test_the_merge_skips_splits_without_kv_tiles(block_n, monkeypatch):
    """Splits past a short sequence's KV tiles write no partial, so the merge must not read one: the partials
    start as NaN here, and any read of an empty split's would show."""
    q_lens, seq_lens = [1, 1, 1, 2], [300, 150, 40, 2]  # 19, 10, 3 and 1 tiles of 16: 8 splits leave some empty
    batch = make_paged_batch(q_lens, seq_lens, 4, 2, head_dim=32, block_size=16, pad_tokens=1)
    expected = _run(paged_attention_ref, batch, 0.2)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    out = _run(paged_attention_triton, batch, 0.2, num_splits=8, tuning=AttentionTuning(block_n=block_n))
    torch.testing.assert_close(out[:5], expected[:5], atol=2e-5, rtol=2e-5)


def test_triton_half_precision_inputs():
    """fp16 here; bf16 only in the GPU tests: Triton 3.6's interpreter computes bf16 tl.dot wrongly."""
    batch = make_paged_batch(*MIXED, 4, 2, head_dim=48, block_size=4, dtype=torch.float16)
    expected = _run(paged_attention_ref, batch, 0.15)
    out = _run(paged_attention_triton, batch, 0.15)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


def test_triton_strided_query_view():
    """q as a slice of a fused qkv projection output (row stride larger than Hq * D)."""
    batch = make_paged_batch(*MIXED, 4, 2, head_dim=16, block_size=4)
    tokens = batch.q.shape[0]
    fused = torch.randn(tokens, (4 + 2 * 2) * 16)
    fused[:, : 4 * 16] = batch.q.reshape(tokens, -1)
    q_view = fused[:, : 4 * 16].view(tokens, 4, 16)
    assert not q_view.is_contiguous()
    args = (batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, 0.3)
    torch.testing.assert_close(paged_attention_triton(q_view, *args), paged_attention_ref(batch.q, *args),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("q_lens,seq_lens", [([1], [70]), ([6], [6]), ([3], [40])])
@pytest.mark.parametrize("num_splits", [None, 4])
def test_triton_single_sequence_without_padding(q_lens, seq_lens, num_splits):
    """One sequence (batch-1 decode): the kernel skips its sequence lookup."""
    batch = make_paged_batch(q_lens, seq_lens, 8, 2, head_dim=32, block_size=8)
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, num_splits=num_splits)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_a_bucket_that_can_hold_a_chunk_gets_prefill_tiles():
    """A captured bucket serves every step up to its size: (128 tokens, 64 rows) holds 3 decodes + a
    100-token prefix-hit chunk, which in 4-token tiles re-reads its context 25 times per KV head. Only a
    bucket whose rows can all be decodes (tokens <= rows) keeps the small tiles (llama3-8b's heads)."""
    def block_q(tokens, rows):
        return launch_plan(tokens, rows, 32, 8, 128, 4096, AttentionTuning()).block_q
    assert block_q(128, 64) == 16 and block_q(1024, 64) == 16  # chunks in 16-token tiles
    assert block_q(2048, 64) == 32  # from prefill_min_tokens on: 32-token tiles (128 rows)
    assert block_q(64, 64) == 4 and block_q(1, 1) == 4  # pure decode buckets: one token per tile row group
    assert block_q(128, 1) == 16  # the step bench's bucket, which timed the chunk at 6.45 ms


def test_a_bucket_that_can_hold_one_chunk_splits_its_kv_range():
    """The splits are chosen for the composition that needs them most. A bucket carrying a chunk may hold just
    that chunk, whose few tiles are all the work: (128, 64) unsplit ran a 100-token prefix hit as 56 programs
    over 2,100 keys each. Pure decode buckets and buckets whose chunk tiles fill the SMs keep their choice."""
    def splits(tokens, rows):
        return launch_plan(tokens, rows, 32, 8, 128, 4096, AttentionTuning()).num_splits
    assert splits(128, 64) == splits(128, 1) == 8  # the same chunk, whatever the padding rows
    assert splits(256, 64) == 4
    assert splits(512, 64) == splits(2048, 64) == 1  # 32+ tiles x 8 heads: a wave of work already
    assert splits(64, 64) == 1 and splits(32, 32) == 2  # decode buckets: split below 2 programs per SM
    assert splits(8, 8) == 8 and splits(1, 1) == 32  # batch 1: 32-position tiles over up to 32 splits


def test_decode_tiles_and_chunk_tiles_take_their_own_pipeline_depths():
    tuning = AttentionTuning(num_stages=2, small_chunk_num_stages=3, prefill_num_stages=4)
    stages = lambda tokens, rows: launch_plan(tokens, rows, 32, 8, 128, 4096, tuning).num_stages
    assert stages(1, 1) == stages(32, 32) == 2  # decode buckets whose KV is split
    assert stages(64, 64) == 3  # an unsplit decode grid (2+ programs an SM): unsplit_num_stages
    assert launch_plan(64, 64, 32, 8, 128, 4096, AttentionTuning(unsplit_num_stages=2)).num_stages == 2
    capped = AttentionTuning(decode_maxnreg=128)  # a register cap for decode tiles only
    assert launch_plan(8, 8, 32, 8, 128, 4096, capped).maxnreg == 128
    assert launch_plan(2048, 1, 32, 8, 128, 4096, capped).maxnreg is None
    batch_1_page = AttentionTuning(small_grid_const_page=True)  # the block size compiled in for batch 1's grid only
    assert launch_plan(1, 1, 32, 8, 128, 4096, batch_1_page).page(16) == 16
    assert launch_plan(8, 8, 32, 8, 128, 4096, batch_1_page).page(16) == 0
    assert stages(128, 64) == stages(1024, 1) == 3  # buckets that can carry a chunk, below prefill_min_tokens
    assert stages(2048, 64) == stages(8192, 1) == 4  # the big chunk tiles


@pytest.mark.parametrize("tokens,rows,small", [(1, 1, True), (2, 2, False), (8, 8, False), (16, 1, False)])
def test_a_small_decode_grid_takes_thin_kv_tiles_over_more_splits(tokens, rows, small):
    """Batch 1 (8 programs for 8 KV heads) only; a 16-token chunk alone (16, 1) is as small, but not a decode."""
    plan = launch_plan(tokens, rows, 32, 8, 128, 8192, AttentionTuning())
    wide = 64  # small buckets' chunk tiles take decode's KV tile rule (big chunk tiles: 128 keys)
    assert (plan.block_n, plan.num_splits > 16) == ((32, True) if small else (wide, False))
    assert launch_plan(tokens, rows, 32, 8, 128, 8192, AttentionTuning(small_grid_programs=None)).block_n == wide


# Chunk tiles with the causal split (KV tiles that a whole query tile sees run unmasked, heaviest tiles first), with
# the chunk knobs: (rows, KV tile, KV splits). The interpreter's time goes with programs x KV tiles: small shapes.
CHUNK_TILES = [(64, None, None), (64, None, 2), (16, 16, 4), (32, 16, None), (128, 128, 4), (128, 32, None)]


@pytest.mark.parametrize(
    "q_lens,seq_lens,heads",
    [
        ([70], [70], (8, 2)),  # a prompt alone: unmasked tiles, then the diagonal
        ([37], [150], (8, 2)),  # a chunk after 113 cached tokens (a tile boundary mid-block)
        ([1, 29, 1, 17], [40, 90, 7, 17], (4, 4)),  # decodes mixed with a chunk and a prompt, no GQA
        ([2, 45], [60, 120], (16, 2)),  # group 8
        ([33], [97], (10, 2)),  # group 5, padded to 8 rows
    ],
)
@pytest.mark.parametrize("rows,block_n,num_splits", CHUNK_TILES)
def test_chunk_tiles_with_the_causal_split_match_the_reference(q_lens, seq_lens, heads, rows, block_n, num_splits):
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=32, block_size=8, pad_seqs=1, pad_tokens=2)
    tuning = AttentionTuning(prefill_block_m=rows, prefill_block_n=block_n, prefill_num_warps=8, prefill_min_tokens=0)
    plan = launch_plan(batch.q.shape[0], len(seq_lens) + 1, heads[0], heads[1], 32, 8 * batch.block_tables.shape[1],
                       tuning, num_splits)
    assert plan.causal_split and plan.block_q * triton.next_power_of_2(heads[0] // heads[1]) == rows
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, num_splits=num_splits, tuning=tuning)
    n = batch.num_real_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("rows,block_n", [(64, None), (32, 16)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_the_causal_split_and_heavy_first_order_change_no_bit(rows, block_n, num_splits):
    """Unmasked tiles are the masked body without its all-true tl.where, so outputs are bitwise today's (under
    the interpreter; on the GPU the compiler may fuse the unmasked tiles' scale and max into one FMA)."""
    batch = make_paged_batch([1, 57, 3], [30, 130, 45], 8, 2, head_dim=32, block_size=8, pad_tokens=2)
    knobs = dict(prefill_block_m=rows, prefill_block_n=block_n, prefill_min_tokens=0)
    split = _run(paged_attention_triton, batch, 0.2, num_splits=num_splits, tuning=AttentionTuning(**knobs))
    plain = _run(paged_attention_triton, batch, 0.2, num_splits=num_splits,
                 tuning=AttentionTuning(**knobs, prefill_causal_split=False))
    n = batch.num_real_tokens
    assert torch.equal(split[:n], plain[:n])


def test_chunk_knobs_reach_the_plan_and_leave_decode_tiles_alone():
    knobs = lambda plan: (plan.block_q, plan.block_n, plan.num_warps, plan.num_stages, plan.causal_split)
    tuning = AttentionTuning(prefill_block_m=64, prefill_block_n=64, prefill_num_warps=4, prefill_num_stages=3)
    assert knobs(launch_plan(2048, 1, 32, 8, 128, 4096, tuning)) == (16, 64, 4, 3, True)
    assert knobs(launch_plan(2048, 1, 32, 8, 128, 4096, AttentionTuning())) == (32, 128, 8, 5, True)  # the default
    wide_heads = launch_plan(2048, 1, 16, 8, 256, 4096, AttentionTuning())
    assert (wide_heads.block_n, wide_heads.num_stages) == (32, 2)  # wider heads: smaller KV tiles, 2 stages (smem)
    # session 17's loop variants: exp2 in the big tiles only, the block size compiled in for every chunk tile
    big, small = launch_plan(2048, 1, 32, 8, 128, 4096, AttentionTuning()), launch_plan(1024, 64, 32, 8, 128, 4096,
                                                                                         AttentionTuning())
    assert (big.scale_in_exp2, big.const_page, small.scale_in_exp2, small.const_page) == (True, True, False, True)
    decode = launch_plan(32, 32, 32, 8, 128, 4096, AttentionTuning())
    assert not (decode.const_page or decode.scale_in_exp2)  # decode tiles: only with their own knobs
    decode = launch_plan(32, 32, 32, 8, 128, 4096, AttentionTuning(decode_const_page=True, decode_scale_in_exp2=True))
    assert decode.page(16) == 16 and decode.scale_in_exp2 and not decode.lazy_rescale
    for decode_tuning in (tuning, AttentionTuning()):
        assert knobs(launch_plan(32, 32, 32, 8, 128, 4096, decode_tuning)) == (4, 64, 4, 2, False)
    assert not launch_plan(2048, 1, 32, 8, 128, 4096, AttentionTuning(prefill_causal_split=False)).causal_split
    # buckets below prefill_min_tokens (2048) keep session 15's chunk tiles, with the causal split
    assert knobs(launch_plan(1024, 64, 32, 8, 128, 4096, AttentionTuning())) == (16, 64, 4, 3, True)
    wide_rows = AttentionTuning(small_chunk_block_m=128)
    assert knobs(launch_plan(128, 64, 32, 8, 128, 4096, wide_rows)) == (32, 64, 4, 3, True)
