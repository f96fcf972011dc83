"""The grammar arena's geometry and host-side bookkeeping: which resident grammar owns which partition.

The tensors belong to SamplingState (allocated once at start-up, sized by --grammar-arena-mb) and are
cut into GRAMMAR_SLOTS equal partitions, one grammar each: no fragmentation, so "is there room?" is a
count of distinct resident grammars, which the front end mirrors exactly (it answers 503 when all
partitions are taken, 400 when a grammar exceeds one partition). Loading is a few copies at
admission, never in the step. Identical constraints share a partition by reference count (n > 1, a
popular schema); a grammar leaves with its last request. This is host mode's; in device mode the
front end chooses the partition (blink/transport/grammar_staging.py) and the GPU scheduler loads it.
"""
from __future__ import annotations

from dataclasses import dataclass

from blink.grammar.tables import GrammarTables
from blink.request import Constraint
from blink.transport.layout import GRAMMAR_SLOTS  # partitions (one staging slot each in device mode)

MIN_ROW_CELLS = 32  # cells per state row assumed when splitting a partition between rows and cells


def arena_geometry(vocab_size: int, nbytes: int) -> tuple[int, int, int]:
    """(partitions, states per partition, cells per partition) for an arena of nbytes (0: none)."""
    if nbytes <= 0:
        return 0, 0, 0
    rest = nbytes // GRAMMAR_SLOTS - vocab_size * 4  # each partition's class row comes first
    states = rest // ((MIN_ROW_CELLS + 1) * 4)
    if states < 16:
        raise ValueError(f"--grammar-arena-mb is too small for a {vocab_size}-token vocabulary: each of its "
                         f"{GRAMMAR_SLOTS} partitions needs at least {vocab_size * 4 + 16 * 33 * 4} bytes")
    return GRAMMAR_SLOTS, states, rest // 4 - states


class ArenaFull(ValueError):
    """Every partition holds another request's grammar: retry later (a 503 at the API)."""


@dataclass
class Resident:
    gid: int  # partition
    tables: GrammarTables
    refs: int = 0


class GrammarArena:
    def __init__(self, state):
        """state: a SamplingState (its grammar_* tensors and geometry)."""
        self.state = state
        self.resident: dict[Constraint, Resident] = {}

    def fits(self, tables: GrammarTables) -> bool:
        s = self.state
        return (s.grammar_slots > 0 and tables.num_states <= s.grammar_states_per_slot
                and tables.num_states * tables.num_classes <= s.grammar_cells_per_slot)

    def acquire(self, key: Constraint, tables: GrammarTables) -> Resident:
        """Load (or share) the grammar; raises ArenaFull when every partition is taken."""
        res = self.resident.get(key)
        if res is None:
            taken = {r.gid for r in self.resident.values()}
            gid = next((g for g in range(self.state.grammar_slots) if g not in taken), None)
            if gid is None:
                raise ArenaFull("the grammar arena is full; retry when running constrained requests finish")
            res = Resident(gid, tables)
            self._load(res)
            self.resident[key] = res
        res.refs += 1
        return res

    def release(self, key: Constraint) -> None:
        res = self.resident[key]
        res.refs -= 1
        if res.refs == 0:
            del self.resident[key]  # no slot points at it any more; the next owner overwrites it

    def _load(self, res: Resident) -> None:
        import torch  # here: the compile worker imports this module's geometry and must stay torch-free

        s, t = self.state, res.tables
        if not self.fits(t):
            raise ValueError("grammar larger than an arena partition (the compiler should have refused it)")
        n, c = t.num_states, t.num_classes
        state_base, cell_base = res.gid * s.grammar_states_per_slot, res.gid * s.grammar_cells_per_slot
        dev = s.grammar_cells.device
        s.grammar_classes[res.gid] = torch.from_numpy(t.token_class).to(dev)
        nxt = torch.from_numpy(t.next_state).to(torch.int64)
        cells = torch.where(nxt >= 0, nxt + state_base, -1).to(torch.int32).reshape(-1)
        s.grammar_cells[cell_base:cell_base + n * c] = cells.to(dev)
        s.grammar_row_base[state_base:state_base + n] = (cell_base + torch.arange(n, dtype=torch.int32) * c).to(dev)

    def slot_grammar(self, key: Constraint, output_ids) -> tuple[int, int]:
        """(partition, global state) for a slot admitted with `output_ids` generated so far."""
        res = self.resident[key]
        local = res.tables.walk(output_ids)
        return res.gid, (res.gid * self.state.grammar_states_per_slot + local if local >= 0 else -1)
