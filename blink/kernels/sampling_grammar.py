"""The grammar's part of sampling: mask a constrained row by its DFA state, then advance the state.

Tables: blink/grammar/tables.py (token -> class, (state, class) -> next state), resident in the
SamplingState's grammar arena. A token is allowed iff its cell holds a next state >= 0; a slot whose
state is -1 (defensive: never reached through the mask) allows only EOS, so it ends at once. The mask
runs inside the penalties kernel's pass (sampling.py) before temperature, top-k and top-p; the advance
runs in the sampler's finish kernel in the engine's step (sampling_record.record_token), or as one tiny launch
after the choice (advance_grammar). Both are capturable: fixed grids, no host sync.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from blink.grammar.tables import CLASS_EOS

if TYPE_CHECKING:
    from blink.kernels.sampling_state import SamplingState

FLAG_GRAMMAR = 4  # SamplingState.flags' grammar bit (sampling_state takes it from here)
_FLAG_GRAMMAR = tl.constexpr(FLAG_GRAMMAR)  # the kernels' copies (Triton reads only constexpr globals)
_CLASS_EOS = tl.constexpr(CLASS_EOS)


@triton.jit
def grammar_allowed(offs, mask, gstate, gid, classes_ptr, row_base_ptr, cells_ptr, vocab_size: tl.constexpr):
    """bool per token of offs: allowed in global state gstate of grammar gid."""
    cls = tl.load(classes_ptr + gid.to(tl.int64) * vocab_size + offs, mask=mask, other=0)
    base = tl.load(row_base_ptr + tl.maximum(gstate, 0))
    nxt = tl.load(cells_ptr + base + cls, mask=mask & (gstate >= 0), other=-1)
    return tl.where(gstate >= 0, nxt >= 0, cls == _CLASS_EOS)


@triton.jit
def grammar_next(gstate, token, gid, live, classes_ptr, row_base_ptr, cells_ptr, vocab_size: tl.constexpr):
    """The global state after `token` from gstate in grammar gid (-1 from -1); scalars or blocks alike."""
    cls = tl.load(classes_ptr + gid.to(tl.int64) * vocab_size + token, mask=live, other=0)
    base = tl.load(row_base_ptr + tl.maximum(gstate, 0), mask=live & (gstate >= 0), other=0)
    return tl.load(cells_ptr + base + cls, mask=live & (gstate >= 0), other=-1)


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
