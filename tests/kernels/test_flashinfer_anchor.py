"""bench/kernels/flashinfer_anchor.py on the CPU: FlashInfer's page description built from our block tables, the
keep-set check its sampler's tokens are held to, and a clear exit where FlashInfer is absent."""
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.kernels import flashinfer_anchor as fa
from bench.kernels import sampler as sb
from blink.kernels import sampling


def test_page_description_of_a_small_batch():
    tables = torch.tensor([[5, 2, 9, 0], [7, 0, 0, 0], [3, 4, 0, 0], [8, 6, 1, 0]], dtype=torch.int32)
    lens = torch.tensor([33, 16, 0, 48], dtype=torch.int32)
    indptr, indices, last = fa.paged_kv_indices(tables, lens, 16)
    assert indptr.tolist() == [0, 3, 4, 4, 7]
    assert indices.tolist() == [5, 2, 9, 7, 8, 6, 1]
    assert last.tolist() == [1, 16, 0, 16]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 200), min_size=1, max_size=8), st.sampled_from([1, 16, 64]))
def test_page_description_holds_each_sequence_tokens(lens, block):
    width = max(1, max(-(-n // block) for n in lens))
    tables = torch.randperm(len(lens) * width, dtype=torch.int32).view(len(lens), width)
    indptr, indices, last = fa.paged_kv_indices(tables, torch.tensor(lens, dtype=torch.int32), block)
    for i, n in enumerate(lens):
        pages = indices[indptr[i]:indptr[i + 1]]
        assert pages.tolist() == tables[i, :len(pages)].tolist()
        held = 0 if len(pages) == 0 else (len(pages) - 1) * block + int(last[i])
        assert held == n and (n == 0 or 1 <= int(last[i]) <= block)


def test_keep_set_check_counts_tokens_the_filters_drop(monkeypatch):
    monkeypatch.setattr(sb, "VOCAB", 512)
    logits, slots, positions, state = sb.make_batch(4, sb.SCENARIOS["top_p"])
    got = sampling.sample_ref(logits, slots, positions, state, 0).token_ids
    assert fa.outside_keep_set(got, logits, slots, state) == 0
    worst = logits.argmin(dim=1)  # never in a top-p 0.9 set of peaked rows
    worst[1:] = got[1:]
    assert fa.outside_keep_set(worst, logits, slots, state) == 1


def test_without_flashinfer_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import fails, as on a machine without it
    monkeypatch.setattr(sys, "argv", ["flashinfer_anchor"])
    with pytest.raises(SystemExit, match="fetch_flashinfer.sh"):
        fa.main()
