"""A token-level DFA as flat tables: what the sampler reads on the GPU.

Tokens that behave alike in every state (same next state everywhere, or disallowed alike) share a class,
so a state's row is as wide as the number of classes, not the vocabulary: a string state of a 128k
vocabulary allows ~120k tokens but they fall into a few dozen classes (by how many characters they
add). Tables, for one grammar:

| array | dtype, shape | meaning |
| --- | --- | --- |
| token_class | i32 [vocab] | class of each token; 0 = never allowed (special tokens), 1 = EOS |
| next_state | i32 [states, classes] | next state (local id), -1 = disallowed; EOS: self loop where accepting |

State 0 is the initial state. A state whose only allowed class is EOS "can only end": the sampler is
then forced to EOS, so the request finishes with `stop` on the next token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLASS_NEVER, CLASS_EOS = 0, 1


@dataclass(frozen=True)
class GrammarTables:
    token_class: np.ndarray  # int32 [vocab]
    next_state: np.ndarray  # int32 [states, classes]

    @property
    def num_states(self) -> int:
        return self.next_state.shape[0]

    @property
    def num_classes(self) -> int:
        return self.next_state.shape[1]

    @property
    def nbytes(self) -> int:
        return self.token_class.nbytes + self.next_state.nbytes

    def walk(self, tokens, state: int = 0) -> int:
        """The state after `tokens` (-1 once a token is disallowed): re-admission after preemption."""
        for t in tokens:
            if state < 0:
                break
            state = int(self.next_state[state, self.token_class[t]])
        return state

    def allowed(self, state: int) -> np.ndarray:
        """bool [vocab]: the tokens allowed in `state` (the torch reference reads the same tables)."""
        return self.next_state[state][self.token_class] >= 0


def build_tables(transitions: dict[int, dict[int, int]], initial: int, finals: set[int], vocab_size: int,
                 eos_ids: tuple[int, ...], max_states: int, max_cells: int) -> GrammarTables:
    """From outlines-core's Index.get_transitions(): {state: {token: next}} over non-special tokens."""
    states = [initial] + sorted(s for s in transitions if s != initial)
    for nexts in transitions.values():  # states reached but with no row of their own (none expected)
        for n in nexts.values():
            if n not in transitions and n not in states:
                states.append(n)
    local = {s: i for i, s in enumerate(states)}
    num_states = len(states)
    if num_states > max_states:
        raise OverflowError(f"{num_states} states exceed the arena's {max_states}")
    eos = np.asarray(eos_ids, dtype=np.int64)

    # Per state, the allowed tokens and their next states, as arrays (one pass over the dicts).
    rows = []
    for s in states:
        edges = transitions.get(s, {})
        toks = np.fromiter(edges.keys(), dtype=np.int64, count=len(edges))
        nxt = np.fromiter((local[n] for n in edges.values()), dtype=np.int64, count=len(edges))
        keep = (toks < vocab_size) & ~np.isin(toks, eos)  # outlines' own EOS edge: handled by the EOS class
        rows.append((toks[keep], nxt[keep]))

    # Class = identical column (next state per state, -1 where disallowed): a rolling 64-bit hash per
    # token over the states, then verified exactly below (so a collision can never go unnoticed).
    h = np.zeros(vocab_size, dtype=np.uint64)
    mult = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for toks, nxt in rows:
            h *= mult
            h[toks] += (nxt.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    ever = np.zeros(vocab_size, dtype=bool)
    for toks, _ in rows:
        ever[toks] = True
    ever[eos[eos < vocab_size]] = False
    _, first, inverse = np.unique(h[ever], return_index=True, return_inverse=True)
    num_classes = 2 + len(first)
    if num_states * num_classes > max_cells:
        raise OverflowError(f"{num_states} states x {num_classes} token classes exceed {max_cells} table cells")
    token_class = np.full(vocab_size, CLASS_NEVER, dtype=np.int32)
    token_class[np.flatnonzero(ever)] = 2 + inverse.astype(np.int32)
    token_class[eos[eos < vocab_size]] = CLASS_EOS

    next_state = np.full((num_states, num_classes), -1, dtype=np.int32)
    for i, (toks, nxt) in enumerate(rows):
        next_state[i, token_class[toks]] = nxt
    for s in finals:
        if s in local:
            next_state[local[s], CLASS_EOS] = local[s]
    for i, (toks, nxt) in enumerate(rows):  # exact check: every edge is what its class says
        if not np.array_equal(next_state[i, token_class[toks]], nxt):
            raise AssertionError("token classes collided; refusing the grammar")
        allowed = np.zeros(vocab_size, dtype=bool)
        allowed[toks] = True
        allowed[eos[eos < vocab_size]] = next_state[i, CLASS_EOS] >= 0
        if not np.array_equal(next_state[i][token_class] >= 0, allowed):
            raise AssertionError("token classes collided; refusing the grammar")
    return GrammarTables(token_class, next_state)
