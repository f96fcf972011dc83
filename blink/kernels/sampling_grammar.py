"""The grammar's part of sampling: mask a constrained row by its DFA state, then advance the state.

Tables: blink/grammar/tables.py (token -> class, (state, class) -> next state), resident in the
SamplingState's grammar arena. A token is allowed iff its cell holds a next state >= 0; a slot whose
state is -1 (defensive: never reached through the mask) allows only EOS, so it ends at once. The mask
runs inside the penalties kernel's pass (sampling.py) before temperature, top-k and top-p; the advance
runs in the sampler's finish kernel in the engine's step (sampling_record.record_token), or as one tiny launch
after the choice (sampling_grammar_advance). Both are capturable: fixed grids, no host sync. This module holds what
the kernels inline and the flag's bit; the torch side, which takes a SamplingState, is sampling_grammar_advance
(so that sampling_state, which takes the bit from here, is not imported back).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.grammar.tables import CLASS_EOS

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
