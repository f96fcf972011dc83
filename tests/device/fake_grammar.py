"""The fake sampler's grammar part for the host-built scheduler tests (harness.py): over the arena the
scheduler wrote, mask, choose and advance as sampling_grammar.py's references do."""
from __future__ import annotations

import numpy as np

from blink.grammar.tables import CLASS_EOS


def constrained_choice(token: int, allowed: np.ndarray) -> int:
    """The first allowed token at or after the fake model's choice."""
    order = (token + np.arange(len(allowed))) % len(allowed)
    return int(order[np.argmax(allowed[order])])


def grammar_sample(sampling: dict[str, np.ndarray], slot: int, token: int) -> int:
    """The constrained slot's token, its state advanced (grammar_mask_ref, advance_grammar_ref on numpy views)."""
    gstate, classes = int(sampling["grammar_state"][slot]), sampling["grammar_classes"][sampling["grammar_id"][slot]]
    if gstate < 0:  # only EOS allowed
        return constrained_choice(token, classes == CLASS_EOS)
    nxt = sampling["grammar_cells"][sampling["grammar_row_base"][gstate] + classes]
    token = constrained_choice(token, nxt >= 0)
    sampling["grammar_state"][slot] = nxt[token]
    return token
