"""The one-launch token count (sampling_record.py) against its torch reference, under the interpreter on CPU."""
import pytest
import torch

from blink.kernels.sampling_record import record_tokens_ref, record_tokens_triton

PENALTIES = 1


@pytest.mark.parametrize("rows", [1, 5, 37])
def test_triton_counts_as_the_reference_does(rows):
    gen = torch.Generator().manual_seed(rows)
    vocab, slots_total = 11, 4
    flags = torch.tensor([1, 0, 3, 5], dtype=torch.int32)  # slot 1 has no penalties; others have bit 0 among more
    slots = torch.randint(-1, slots_total, (rows,), generator=gen, dtype=torch.int32)
    tokens = torch.randint(-1, vocab, (rows,), generator=gen)
    if rows > 1:
        slots[:2], tokens[:2] = 2, 7  # two rows on one slot and token: both count
    counts = {impl: torch.randint(0, 3, (slots_total, vocab), generator=torch.Generator().manual_seed(0),
                                  dtype=torch.int32) for impl in ("ref", "triton")}
    before = counts["ref"].clone()
    record_tokens_ref(counts["ref"], flags, PENALTIES, slots, tokens)
    record_tokens_triton(counts["triton"], flags, PENALTIES, slots, tokens)
    assert torch.equal(counts["triton"], counts["ref"])
    live = (slots >= 0) & (tokens >= 0) & ((flags[slots.clamp(min=0).long()] & PENALTIES) != 0)
    assert (counts["ref"] - before).sum() == live.sum()  # the reference itself counts what it should
    if rows > 1:
        assert counts["ref"][2, 7] - before[2, 7] >= 2
