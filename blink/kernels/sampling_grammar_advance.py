"""The grammar's torch side over a SamplingState: the reference mask, and the advance after a choice as one tiny
launch (sampling.sample_triton's path outside the engine's step, whose finish kernel advances in place).

The kernels' parts (the mask inside the penalties pass, the next state) are sampling_grammar's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from blink.grammar.tables import CLASS_EOS
from blink.kernels.sampling_grammar import _FLAG_GRAMMAR, FLAG_GRAMMAR, grammar_next

if TYPE_CHECKING:
    from blink.kernels.sampling_state import SamplingState


@triton.jit
def _advance_kernel(slots_ptr, tokens_ptr, flags_ptr, state_ptr, gid_ptr, classes_ptr, row_base_ptr, cells_ptr,
                    vocab_size: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    valid = r < ROWS
    slot = tl.load(slots_ptr + r, mask=valid, other=-1)
    safe = tl.maximum(slot, 0)
    flags = tl.load(flags_ptr + safe, mask=valid & (slot >= 0), other=0)
    live = valid & (slot >= 0) & ((flags & _FLAG_GRAMMAR) != 0)
    gstate = tl.load(state_ptr + safe, mask=live, other=-1)
    token = tl.load(tokens_ptr + r, mask=live, other=0).to(tl.int32)
    gid = tl.load(gid_ptr + safe, mask=live, other=0)
    nxt = grammar_next(gstate, token, gid, live, classes_ptr, row_base_ptr, cells_ptr, vocab_size)
    tl.store(state_ptr + safe, nxt, mask=live)


def grammar_mask_ref(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """bool [S, V]: False where a constrained row's grammar forbids the token (True elsewhere)."""
    safe = slots.clamp(min=0).long()
    constrained = (slots >= 0) & ((state.flags[safe] & FLAG_GRAMMAR) != 0)
    if state.grammar_slots == 0 or not bool(constrained.any()):
        return torch.ones_like(logits, dtype=torch.bool)
    gstate = state.grammar_state[safe].long()
    cls = state.grammar_classes[state.grammar_id[safe].long()].long()  # [S, V]
    base = state.grammar_row_base[gstate.clamp(min=0)].long()
    # Rows that are not constrained index garbage here; the clamp keeps it in bounds, the where drops it.
    nxt = state.grammar_cells[(base[:, None] + cls).clamp(0, state.grammar_cells.numel() - 1)]
    allowed = torch.where((gstate >= 0)[:, None], nxt >= 0, cls == CLASS_EOS)
    return torch.where(constrained[:, None], allowed, True)


def advance_grammar_ref(slots: torch.Tensor, token_ids: torch.Tensor, state: SamplingState) -> None:
    safe = slots.clamp(min=0).long()
    live = (slots >= 0) & ((state.flags[safe] & FLAG_GRAMMAR) != 0)
    if not bool(live.any()):
        return
    rows = live.nonzero().squeeze(1)
    s = safe[rows]
    gstate = state.grammar_state[s].long()
    cls = state.grammar_classes[state.grammar_id[s].long(), token_ids[rows].long()].long()
    base = state.grammar_row_base[gstate.clamp(min=0)].long()
    nxt = state.grammar_cells[base + cls]
    state.grammar_state[s] = torch.where(gstate >= 0, nxt, -1)


def advance_grammar_triton(slots: torch.Tensor, token_ids: torch.Tensor, state: SamplingState) -> None:
    rows = slots.shape[0]
    _advance_kernel[(1,)](slots, token_ids, state.flags, state.grammar_state, state.grammar_id,
                          state.grammar_classes, state.grammar_row_base, state.grammar_cells, state.vocab_size,
                          ROWS=rows, BLOCK=triton.next_power_of_2(max(rows, 1)), num_warps=1)


def advance_grammar(slots: torch.Tensor, token_ids: torch.Tensor, state: SamplingState) -> None:
    """Move every constrained row's slot to the state after its sampled token (one row per slot)."""
    if state.grammar_slots == 0:  # no arena: no slot can be constrained, and nothing to launch
        return
    impl = advance_grammar_triton if token_ids.is_cuda else advance_grammar_ref
    impl(slots, token_ids, state)
