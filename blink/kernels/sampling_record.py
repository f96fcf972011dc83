"""After the choice: count each row's new token in its slot's output_counts, the history that presence and
frequency penalties read at the next step. In the engine's step the sampler's finish kernel does it (record_token,
with the grammar's advance); else one launch; the torch version (record_tokens_ref) is about ten small
kernels, ~15 us of a batch-1 step on the H200 (perf.md, 2026-12-02 session 12's timeline). Capturable: a fixed
grid, no host sync. Rows whose slot is negative, whose token is negative, or whose slot has no penalties add 0,
so padding rows may point anywhere valid or at -1; rows sharing a slot and token both count (atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.sampling_grammar import _FLAG_GRAMMAR, grammar_next

FLAG_PENALTIES = 1  # SamplingState.flags' penalties bit (sampling_state takes it from here)
_FLAG_PENALTIES = tl.constexpr(FLAG_PENALTIES)


def record_tokens_ref(counts: torch.Tensor, flags: torch.Tensor, penalties_flag: int, slots: torch.Tensor,
                      token_ids: torch.Tensor) -> None:
    valid_slot = slots >= 0
    safe_slots = torch.where(valid_slot, slots, 0).long()
    counted = ((flags[safe_slots] & penalties_flag) != 0) & valid_slot & (token_ids >= 0)
    flat_index = safe_slots * counts.shape[1] + token_ids.clamp(min=0)
    # index_add_ accumulates duplicates correctly (atomics on CUDA), unlike an indexed +=.
    counts.view(-1).index_add_(0, flat_index, counted.to(counts.dtype))


@triton.jit
def _record_kernel(slots_ptr, tokens_ptr, flags_ptr, counts_ptr, vocab_size,
                   FLAG: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    valid = r < ROWS
    slot = tl.load(slots_ptr + r, mask=valid, other=-1)
    token = tl.load(tokens_ptr + r, mask=valid, other=-1)
    live = valid & (slot >= 0) & (token >= 0)
    flags = tl.load(flags_ptr + tl.maximum(slot, 0), mask=live, other=0)
    live = live & ((flags & FLAG) != 0)
    offs = tl.maximum(slot, 0).to(tl.int64) * vocab_size + tl.maximum(token, 0)
    tl.atomic_add(counts_ptr + offs, tl.full([BLOCK], 1, tl.int32), mask=live)


@triton.jit
def record_token(row, token, slots_ptr, flags_ptr, counts_ptr, gstate_ptr, gid_ptr, classes_ptr, row_base_ptr,
                 cells_ptr, vocab_size: tl.constexpr, GRAMMAR: tl.constexpr):
    """One row's updates after the choice, inside the sampler's finish kernel (sampling.py: two launches fewer a
    step): the count as _record_kernel's and, with GRAMMAR, the DFA advance as sampling_grammar_advance's
    _advance_kernel."""
    slot = tl.load(slots_ptr + row)
    if slot >= 0:
        flags = tl.load(flags_ptr + slot)
        if (flags & _FLAG_PENALTIES) != 0:
            tl.atomic_add(counts_ptr + slot.to(tl.int64) * vocab_size + token, 1)  # rows may share a slot and token
        if GRAMMAR:
            if (flags & _FLAG_GRAMMAR) != 0:
                nxt = grammar_next(tl.load(gstate_ptr + slot), token, tl.load(gid_ptr + slot), True, classes_ptr,
                                   row_base_ptr, cells_ptr, vocab_size)
                tl.store(gstate_ptr + slot, nxt)


def record_tokens_triton(counts: torch.Tensor, flags: torch.Tensor, penalties_flag: int, slots: torch.Tensor,
                         token_ids: torch.Tensor) -> None:
    assert counts.dtype == torch.int32 and counts.is_contiguous()
    rows = slots.shape[0]
    _record_kernel[(1,)](slots, token_ids, flags, counts, counts.shape[1], FLAG=penalties_flag, ROWS=rows,
                         BLOCK=triton.next_power_of_2(max(rows, 1)), num_warps=1)


def record_tokens(counts: torch.Tensor, flags: torch.Tensor, penalties_flag: int, slots: torch.Tensor,
                  token_ids: torch.Tensor) -> None:
    impl = record_tokens_triton if token_ids.is_cuda else record_tokens_ref
    impl(counts, flags, penalties_flag, slots, token_ids)
