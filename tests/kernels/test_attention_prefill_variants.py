"""Issue 17's inner-loop variants of the chunk tiles (blink/kernels/attention_tile.py) against the torch reference, and
the same variants on decode tiles (opt-in since session 18)."""
import pytest
import torch

from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from tests.kernels.paged_batch import make_paged_batch

VARIANTS = {
    "exp2": dict(prefill_scale_in_exp2=True),
    "page": dict(prefill_const_page=True),  # 8-key blocks in 16-key tiles here
    "all": dict(prefill_scale_in_exp2=True, prefill_lazy_rescale=8.0, prefill_const_page=True),  # the bench's lazy8
    "lazy-half": dict(prefill_lazy_rescale=0.5),  # without exp2; a threshold low enough that both branches run
    "gather": dict(prefill_const_page=True, prefill_page_gather=True),  # a tile's 2 entries at once (session 31)
}


def _run(fn, batch, scale, **kwargs):
    return fn(batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
              scale, **kwargs)


@pytest.mark.parametrize(
    "q_lens,seq_lens,heads",
    [
        ([70], [70], (8, 2)),  # a prompt alone: unmasked tiles, then the diagonal
        ([37], [150], (8, 2)),  # a chunk after 113 cached tokens
        ([1, 29, 1, 17], [40, 90, 7, 17], (10, 2)),  # decodes with a chunk and a prompt (ragged), group 5 (8 rows)
    ],
)
# q_scale 8: scores spread over ~2^12, so that the maxima grow past the lazy threshold
@pytest.mark.parametrize("variant,q_scale", [("exp2", 1.0), ("page", 1.0), ("all", 1.0), ("all", 8.0),
                                             ("lazy-half", 1.0), ("lazy-half", 8.0), ("gather", 1.0)])
def test_prefill_variants_match_the_reference(q_lens, seq_lens, heads, variant, q_scale):
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=32, block_size=8, pad_seqs=1, pad_tokens=2)
    batch.q.mul_(q_scale)
    tuning = AttentionTuning(prefill_block_m=32, prefill_block_n=16, prefill_min_tokens=0, **VARIANTS[variant])
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, tuning=tuning)
    n = batch.num_real_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("variant", ["exp2", "all", "gather"])
def test_prefill_variants_with_kv_splits(variant):
    """Split partials keep their maxima in the log2 domain, so the merge is unchanged (the lazy maxima are stale
    but consistent with their sums)."""
    batch = make_paged_batch([1, 45], [60, 120], 16, 2, head_dim=32, block_size=8, pad_tokens=2)
    tuning = AttentionTuning(prefill_block_m=64, prefill_block_n=16, prefill_min_tokens=0, **VARIANTS[variant])
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, num_splits=2, tuning=tuning)
    torch.testing.assert_close(out[:46], expected[:46], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("block_size,block_n", [(8, 16), (4, 16), (16, 64)])
def test_a_tiles_entries_gathered_at_once_read_the_same_keys(block_size, block_n):
    """PAGE_GATHER: a tile's entries as one vector spread to its keys by tl.gather; bit-equal to one entry a key (the
    same keys, the same arithmetic), through tiles past kv_end, a cached prefix and a ragged batch; chunk tiles only."""
    batch = make_paged_batch([1, 45, 70], [60, 120, 70], 8, 2, head_dim=32, block_size=block_size, pad_seqs=1,
                             pad_tokens=2)
    page = dict(prefill_block_m=32, prefill_block_n=block_n, prefill_min_tokens=0, prefill_const_page=True)
    gathered = AttentionTuning(**page, prefill_page_gather=True)
    assert launch_plan(116, 3, 8, 2, 32, 128, gathered).page_gather
    assert not launch_plan(8, 8, 8, 2, 32, 128, gathered).page_gather  # decode tiles keep their loads
    out = _run(paged_attention_triton, batch, 0.2, tuning=gathered)
    n = batch.num_real_tokens
    torch.testing.assert_close(out[:n], _run(paged_attention_triton, batch, 0.2, tuning=AttentionTuning(**page))[:n],
                               atol=0, rtol=0)
    torch.testing.assert_close(out[:n], _run(paged_attention_ref, batch, 0.2)[:n], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("block_size", [32, 64, 12])
def test_a_block_of_whole_kv_tiles_compiles_in_too_and_any_other_stays_a_runtime_value(block_size):
    """16-key tiles: blocks of 32 / 64 keys hold whole tiles (one table entry a tile), 12 is no power of two."""
    batch = make_paged_batch([30], [75], 8, 2, head_dim=32, block_size=block_size, pad_tokens=1)
    tuning = AttentionTuning(prefill_block_m=32, prefill_block_n=16, prefill_min_tokens=0, **VARIANTS["page"])
    plan = launch_plan(31, 1, 8, 2, 32, 128, tuning)
    assert plan.page(32) == 32 and plan.page(64) == 64 and plan.page(16) == 16 and plan.page(8) == 8
    assert plan.page(12) == 0 and plan.page(48) == 0
    out = _run(paged_attention_triton, batch, 0.2, tuning=tuning)
    torch.testing.assert_close(out[:30], _run(paged_attention_ref, batch, 0.2)[:30], atol=2e-5, rtol=2e-5)
    runtime = _run(paged_attention_triton, batch, 0.2, tuning=AttentionTuning(
        prefill_block_m=32, prefill_block_n=16, prefill_min_tokens=0, prefill_const_page=False))
    torch.testing.assert_close(out[:30], runtime[:30], atol=0, rtol=0)  # the same keys, the same arithmetic


@pytest.mark.parametrize("num_splits", [None, 4])
def test_the_batch_1_grid_reads_a_64_token_block_a_tile_at_a_time(num_splits):
    """Decode's batch-1 grid (32-key tiles, block size compiled in) over 64-token blocks: KV splits that start past
    the sequence's keys and a masked last tile; bit-equal to the runtime block size."""
    batch = make_paged_batch([1], [300], 8, 2, head_dim=32, block_size=64)
    on = AttentionTuning(block_n=32, small_grid_programs=8)
    plan = launch_plan(1, 1, 8, 2, 32, batch.block_tables.shape[1] * 64, on, num_splits)
    assert plan.page(64) == 64
    out = _run(paged_attention_triton, batch, 0.2, tuning=on, num_splits=num_splits)
    torch.testing.assert_close(out[:1], _run(paged_attention_ref, batch, 0.2)[:1], atol=2e-5, rtol=2e-5)
    off = AttentionTuning(block_n=32, small_grid_programs=8, small_grid_const_page=False)
    torch.testing.assert_close(out[:1], _run(paged_attention_triton, batch, 0.2, tuning=off, num_splits=num_splits)[:1],
                               atol=0, rtol=0)


def test_prefill_variants_leave_decode_tiles_alone():
    tuning = AttentionTuning(**VARIANTS["all"])
    loop = lambda plan: (plan.scale_in_exp2, plan.lazy_rescale, plan.page(16))
    assert loop(launch_plan(32, 32, 32, 8, 128, 4096, tuning)) == (False, 0.0, 0)  # a pure decode bucket
    # batch 1, splits in the kernel: the prefill knobs reach nothing; the block size comes from
    # small_grid_const_page (session 19's default), which is a decode knob
    assert loop(launch_plan(1, 1, 32, 8, 128, 32768, tuning)) == (False, 0.0, 16)
    assert loop(launch_plan(1, 1, 32, 8, 128, 32768, AttentionTuning(**VARIANTS["all"], small_grid_const_page=False))) \
        == (False, 0.0, 0)
    # small chunk tiles: exp2 only with small_chunk_scale_in_exp2 (off: +/-3% on the H200, session 17)
    assert loop(launch_plan(128, 64, 32, 8, 128, 4096, tuning)) == (False, 8.0, 16)
    assert loop(launch_plan(128, 64, 32, 8, 128, 4096, AttentionTuning(small_chunk_scale_in_exp2=True)))[0]
    assert loop(launch_plan(8192, 1, 32, 8, 128, 8192, tuning)) == (True, 8.0, 16)  # the big chunk tiles
    # the defaults since session 17: exp2 and the compiled-in block size, no lazy rescaling
    assert loop(launch_plan(8192, 1, 32, 8, 128, 8192, AttentionTuning())) == (True, 0.0, 16)
    assert loop(launch_plan(128, 64, 32, 8, 128, 4096, AttentionTuning())) == (False, 0.0, 16)


@pytest.mark.parametrize("knobs", [dict(decode_const_page=True),
                                   dict(decode_const_page=True, decode_scale_in_exp2=True),
                                   dict(decode_scale_in_exp2=True, split_min_tiles=2, max_grid_splits=8)])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_decode_variants_match_the_reference(knobs, num_splits):
    """A decode bucket (one token a sequence, padding rows): the compiled-in block size and the scale in exp2, with and
    without KV splits (the partials' maxima stay in the log2 domain for the merge) and with the kernel's own split
    count (split_min_tiles)."""
    batch = make_paged_batch([1] * 5, [1, 17, 300, 64, 129], 16, 2, head_dim=32, block_size=16, pad_seqs=2,
                             pad_tokens=1)
    tuning = AttentionTuning(block_n=32, **knobs)
    plan = launch_plan(batch.q.shape[0], 7, 16, 2, 32, batch.block_tables.shape[1] * 16, tuning, num_splits)
    assert plan.page(16) == (16 if knobs.get("decode_const_page") else 0)
    assert plan.scale_in_exp2 == knobs.get("decode_scale_in_exp2", False)
    expected = _run(paged_attention_ref, batch, 0.2)
    out = _run(paged_attention_triton, batch, 0.2, tuning=tuning, num_splits=num_splits)
    torch.testing.assert_close(out[:5], expected[:5], atol=2e-5, rtol=2e-5)


def test_the_gathered_page_is_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv("BLINK_PAGE_GATHER", raising=False)
    assert AttentionTuning().prefill_page_gather  # timed in session 33 (perf.md)
    monkeypatch.setenv("BLINK_PAGE_GATHER", "0")
    assert not AttentionTuning().prefill_page_gather


@pytest.mark.parametrize("block_n,num_splits", [(32, None), (64, 2)])
def test_decode_tiles_gather_their_entries_too_when_asked(block_n, num_splits):
    """decode_page_gather (a bench variant, untimed): decode tiles over 16-token blocks, bit-equal to one entry a key
    with the page compiled in, through a split past the keys and a masked last tile."""
    batch = make_paged_batch([1, 1, 1], [300, 17, 90], 8, 2, head_dim=32, block_size=16, pad_seqs=1)
    page = dict(block_n=block_n, decode_const_page=True)
    gathered = AttentionTuning(**page, decode_page_gather=True)
    assert launch_plan(3, 3, 8, 2, 32, 320, gathered, num_splits).page_gather
    out = _run(paged_attention_triton, batch, 0.2, tuning=gathered, num_splits=num_splits)
    expected = _run(paged_attention_triton, batch, 0.2, tuning=AttentionTuning(**page), num_splits=num_splits)
    torch.testing.assert_close(out[:3], expected[:3], atol=0, rtol=0)
    torch.testing.assert_close(out[:3], _run(paged_attention_ref, batch, 0.2)[:3], atol=2e-5, rtol=2e-5)
