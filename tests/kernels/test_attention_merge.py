"""The KV splits merged inside the attention kernel by the tile's last split (attention_merge.py) against the
reference and against the separate merge kernel; the tickets come back zeroed, and too few tickets fall back."""
import pytest
import torch

from blink.kernels import attention_merge
from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_merge import split_tickets
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from tests.kernels.paged_batch import make_paged_batch

IN_KERNEL = AttentionTuning(merge_in_kernel=True)
CASES = [  # (q_lens, seq_lens, heads): decodes with empty splits, a chunk over a context, a mixed batch
    ([1, 1, 1], [3, 70, 200], (8, 2)),
    ([5], [90], (4, 4)),
    ([5, 1, 1, 3, 1], [5, 9, 1, 120, 17], (8, 1)),
]


def _args(batch, scale=0.2):
    return (batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, scale)


def _tiles(batch, tuning, num_splits):
    plan = launch_plan(batch.q.shape[0], batch.seq_lens.shape[0], batch.q.shape[1], batch.k_cache.shape[2],
                       batch.q.shape[2], batch.block_tables.shape[1] * batch.k_cache.shape[1], tuning, num_splits)
    return plan.num_tiles * batch.k_cache.shape[2]


@pytest.mark.parametrize("q_lens,seq_lens,heads", CASES)
@pytest.mark.parametrize("num_splits", [2, 4, 16])
@pytest.mark.parametrize("merge_values", [attention_merge.MERGE_VALUES, 256])  # all splits in one load; 1-2 a load
def test_the_last_split_merges_as_the_reference_and_leaves_the_tickets_zero(q_lens, seq_lens, heads, num_splits,
                                                                            merge_values, monkeypatch):
    monkeypatch.setattr(attention_merge, "MERGE_VALUES", merge_values)
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=32, block_size=8, pad_seqs=1, pad_tokens=2)
    n = batch.num_real_tokens
    tickets = split_tickets(batch.q.shape[0] + batch.seq_lens.shape[0], heads[1], "cpu")
    expected = paged_attention_ref(*_args(batch))
    separate = paged_attention_triton(*_args(batch), num_splits=num_splits)
    for _ in range(2):  # a second launch finds the tickets as the first left them
        merged = paged_attention_triton(*_args(batch), num_splits=num_splits, split_tickets=tickets, tuning=IN_KERNEL)
        torch.testing.assert_close(merged[:n], expected[:n], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(merged[:n], separate[:n], atol=1e-6, rtol=1e-6)
        assert not tickets.any()


def test_dynamic_splits_merge_in_the_kernel_with_splits_that_exit_early():
    # A 1k-key block table at batch 1 takes the kernel's own split count: short sequences leave most splits empty,
    # and those exit before loading q, yet take their ticket.
    tuning = AttentionTuning(block_n=16, split_min_tiles=2, max_grid_splits=16, merge_in_kernel=True)
    for seq_len in [1, 40, 300]:
        batch = make_paged_batch([1], [seq_len], 8, 2, head_dim=32, block_size=16, max_blocks=64)
        assert launch_plan(1, 1, 8, 2, 32, 64 * 16, tuning).split_min_tiles == 2
        tickets = split_tickets(2, 2, "cpu")
        out = paged_attention_triton(*_args(batch), tuning=tuning, split_tickets=tickets)
        torch.testing.assert_close(out[:1], paged_attention_ref(*_args(batch))[:1], atol=2e-5, rtol=2e-5)
        assert not tickets.any()


def test_too_few_tickets_or_the_merge_kernel_knob_take_the_merge_kernel():
    q_lens, seq_lens, heads = CASES[0]
    batch = make_paged_batch(q_lens, seq_lens, *heads, head_dim=32, block_size=8)
    expected = paged_attention_ref(*_args(batch))
    needed = _tiles(batch, IN_KERNEL, 4)
    assert AttentionTuning().merge_in_kernel  # the default since session 19
    for tickets, tuning in [(split_tickets(needed - 1, 1, "cpu"), IN_KERNEL),
                            (split_tickets(needed, 1, "cpu"), AttentionTuning(merge_in_kernel=False))]:
        tickets.fill_(7)  # untouched if the kernel does not take them (a used ticket would reach 0 or 8)
        out = paged_attention_triton(*_args(batch), num_splits=4, tuning=tuning, split_tickets=tickets)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
        assert (tickets == 7).all()
