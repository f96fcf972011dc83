"""Decode splits chosen in the kernel (AttentionTuning.split_min_tiles): the grid is sized for the longest context and
each program keeps the splits its own sequence's KV fills; the others leave the merge's "no tiles" marker."""
import pytest
import torch

from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from tests.kernels.paged_batch import make_paged_batch

BLOCK = 16


def _decode_batch(seq_lens, heads, pad_seqs=2, stale=()):
    """One query token per sequence, as in a decode bucket: padding rows (no queries) and one padding token, so the
    bucket stays decode-only (tokens <= rows); `stale` gives padding rows leftover seq_lens and block tables."""
    batch = make_paged_batch([1] * len(seq_lens), list(seq_lens), *heads, head_dim=32, block_size=BLOCK,
                             pad_seqs=pad_seqs, pad_tokens=min(pad_seqs, 1))
    for i, seq_len in enumerate(stale):
        batch.seq_lens[len(seq_lens) + i] = seq_len
        batch.block_tables[len(seq_lens) + i] = batch.block_tables[0]
    return batch


def _run(batch, **kwargs):
    """The kernel's output, and the per-split maxima it left for the merge (partials, maxima and sums start as
    NaN, so a split that the merge read without its having written would show)."""
    seen = []  # torch.empty's: the partials, then the maxima (the sums and the output come from empty_like)

    def nan_filled(make, record):
        def call(*args, **kw):
            t = make(*args, **kw).fill_(float("nan"))
            seen.extend([t] if record else [])
            return t
        return call

    args = (batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, 0.2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty", nan_filled(torch.empty, True))
        mp.setattr(torch, "empty_like", nan_filled(torch.empty_like, False))
        out = paged_attention_triton(*args, **kwargs)
    maxima = next((t for t in seen if t.dim() == 3), None)
    return out, maxima, paged_attention_ref(*args)


def _plan(batch, tuning, num_splits=None):
    q_heads, kv_heads = batch.q.shape[1], batch.k_cache.shape[2]
    return launch_plan(batch.q.shape[0], batch.seq_lens.shape[0], q_heads, kv_heads, 32,
                       batch.block_tables.shape[1] * BLOCK, tuning, num_splits)


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (16, 2)])  # GQA groups 1, 4, 8
@pytest.mark.parametrize("min_tiles,max_grid,block_n", [(1, 16, 16), (2, 8, 16), (4, 64, 16), (2, 32, 32)])
def test_dynamic_splits_match_the_reference_at_mixed_lengths(heads, min_tiles, max_grid, block_n):
    seq_lens = [1, 17, 300, 64, 129]  # 1 to 19 tiles of 16: from one split to the grid's whole width
    batch = _decode_batch(seq_lens, heads, stale=[250])
    tuning = AttentionTuning(block_n=block_n, split_min_tiles=min_tiles, max_grid_splits=max_grid)
    plan = _plan(batch, tuning)
    assert plan.split_min_tiles == min_tiles and plan.num_splits == min(max_grid, 16 if block_n == 16 else 8)
    out, maxima, expected = _run(batch, tuning=tuning)
    n = len(seq_lens)
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)
    # Every real row's splits: those with KV tiles hold a true maximum, the rest exactly the marker
    for s, seq_len in enumerate(seq_lens):
        worked = (maxima[s] > -1.0e30).sum(dim=-1)
        assert worked.tolist() == [plan.splits_with_work(seq_len)] * heads[0], (s, seq_len)
        assert (maxima[s][maxima[s] <= -1.0e30] == -1.0e30).all()
    assert plan.splits_with_work(1) == 1 and plan.splits_with_work(300) > 1


@pytest.mark.parametrize("seq_len,min_tiles,used", [(40, 4, 1), (256, 2, 8), (300, 2, 7), (300, 4, 4), (130, 16, 1)])
def test_the_kernel_keeps_one_split_up_to_the_whole_grid(seq_len, min_tiles, used):
    """A sequence that fills fewer than two splits keeps one (no merge weight elsewhere); one that fills more than
    the grid takes it all (8 splits, forced here). 19 tiles over 8 splits: 3 each, so 7 splits get work."""
    batch = _decode_batch([seq_len], (8, 2), pad_seqs=0)
    tuning = AttentionTuning(block_n=16, split_min_tiles=min_tiles)
    plan = _plan(batch, tuning, num_splits=8)
    assert plan.splits_with_work(seq_len) == used
    out, maxima, expected = _run(batch, tuning=tuning, num_splits=8)
    torch.testing.assert_close(out[:1], expected[:1], atol=2e-5, rtol=2e-5)
    assert ((maxima[0] > -1.0e30).sum(dim=-1) == used).all()


def test_dynamic_splits_leave_prefill_plans_and_one_split_launches_as_today():
    dyn = AttentionTuning(split_min_tiles=4, max_grid_splits=128, grid_programs_per_sm=6)
    for tokens, rows in [(128, 64), (2048, 1), (256, 64)]:  # buckets that can carry a chunk
        assert launch_plan(tokens, rows, 32, 8, 128, 32768, dyn) == launch_plan(tokens, rows, 32, 8, 128, 32768,
                                                                                 AttentionTuning())
    assert launch_plan(256, 256, 32, 8, 128, 32768, dyn).split_min_tiles == 0  # a full wave: no splits, no rule
    assert launch_plan(1, 1, 32, 8, 128, 32768, dyn, num_splits=1).split_min_tiles == 0


def test_the_default_tuning_counts_splits_in_the_kernel_only_at_batch_1_with_a_long_max_len():
    """By default the kernel counts its splits only in the batch-1 grid and only where the block table allows
    split_min_kv_len keys; every other plan (decode and chunk buckets, short max lens) is the host's."""
    shapes = [(1, 1), (2, 2), (8, 8), (32, 32), (64, 64), (128, 64), (128, 1), (2048, 64)]
    off = AttentionTuning(small_grid_split_min_tiles=None)
    for max_len in (1024, 8192, 32768):
        for tokens, rows in shapes:
            plan = launch_plan(tokens, rows, 32, 8, 128, max_len, AttentionTuning())
            dyn = (tokens, rows) == (1, 1) and max_len >= AttentionTuning().split_min_kv_len
            assert plan.split_min_tiles == (2 if dyn else 0)
            assert (plan == launch_plan(tokens, rows, 32, 8, 128, max_len, off)) != dyn
    assert launch_plan(1, 1, 32, 8, 128, 32768, AttentionTuning()).num_splits == 64
    # the host's choices at 8192 (decode: perf.md session 13; chunks: session 15's tiles below 2,048 tokens), pinned
    splits = {(t, r): launch_plan(t, r, 32, 8, 128, 8192, AttentionTuning()).num_splits for t, r in shapes}
    assert splits == {(1, 1): 32, (2, 2): 16, (8, 8): 8, (32, 32): 2, (64, 64): 1, (128, 64): 8, (128, 1): 8,
                      (2048, 64): 1}


def test_the_dynamic_grid_is_sized_for_the_longest_context():
    """Batch 1 at a 32k max len: 64 (or 128) splits in the grid; 1k keeps 8, 4k 32, 32k all (32-position tiles,
    4 per split). A short max len stays bounded by the host rule's couple of tiles per split."""
    plan = launch_plan(1, 1, 32, 8, 128, 32768, AttentionTuning(split_min_tiles=4))
    assert (plan.block_n, plan.num_splits) == (32, 64)
    assert [plan.splits_with_work(n) for n in (1, 1024, 4096, 32768)] == [1, 8, 32, 64]
    wide = AttentionTuning(split_min_tiles=8, max_grid_splits=128, grid_programs_per_sm=6)
    assert launch_plan(1, 1, 32, 8, 128, 32768, wide).num_splits == 128
    assert launch_plan(8, 8, 32, 8, 128, 32768, wide).num_splits == 16  # batch 8: 6 programs per SM
    assert launch_plan(1, 1, 32, 8, 128, 256, AttentionTuning(split_min_tiles=1)).num_splits == 4
