"""Grammar staging: how a constraint's compiled tables reach the GPU in device mode, with no host work per step.

The segment has one staging slot per grammar arena partition (layout.GRAMMAR_SLOTS). The producer side
(the front end, or DeviceEngine in process) writes a constraint's flat tables (blink/grammar/tables.py:
token -> class, then next local state per (state, class)) into a slot and names the slot, its counts and
the slot's write generation in the descriptor; the GPU scheduler copies the slot into the same partition
of its arena when it admits the request, unless that generation is already loaded there
(csrc/sched_plan.h). So identical constraints share one slot and one copy, and a slot keeps its tables
after its last request (LRU) so that a later identical constraint costs no copy either.

A slot is rewritten only while nothing holds it: a holder is a reservation (taken before submitting, so
a 503 can be answered up front; released by its caller) or a submitted request until its last egress
record (EgressConsumer calls `finished`), which comes after the GPU's last read of the tables.
Thread-safe: the front end reserves and submits on its event loop and reads egress on another thread.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from blink.transport.shm import Segment


class StagingFull(RuntimeError):
    """Every slot holds another constraint that requests in flight use: retry later (a 503 at the API)."""


@dataclass
class _Slot:
    key: object = None  # the constraint whose tables the slot holds (None: never written)
    gen: int = 0  # write generation, unique over the segment's life (0: never written)
    states: int = 0
    classes: int = 0
    reserved: int = 0
    requests: set[int] = field(default_factory=set)
    last_used: int = 0

    @property
    def held(self) -> bool:
        return self.reserved > 0 or bool(self.requests)


class GrammarStaging:
    def __init__(self, seg: Segment):
        lay = seg.layout
        self.control = seg.control
        self.num_slots, self.slot_words = lay.grammar_slots, lay.grammar_slot_words
        self.words = seg.array(np.int32, self.num_slots * self.slot_words, lay.grammar_staging).reshape(
            self.num_slots, self.slot_words)
        self._slots = [_Slot() for _ in range(self.num_slots)]
        self._by_key: dict[object, int] = {}
        self._by_request: dict[int, int] = {}
        self._gen = self._tick = 0
        self._lock = threading.Lock()

    @staticmethod
    def of(seg: Segment) -> GrammarStaging | None:
        """The process's one bookkeeper of `seg`'s slots (None: the segment has no staging section)."""
        if seg.layout.grammar_slots == 0:
            return None
        staging = getattr(seg, "_grammar_staging", None)
        if staging is None:
            staging = seg._grammar_staging = GrammarStaging(seg)
        return staging

    def reserve(self, key, token_class: np.ndarray, next_state: np.ndarray) -> int:
        """Hold a slot with `key`'s tables (written now unless resident); returns the slot. Raises StagingFull
        when every slot is held by other constraints, ValueError for tables the slot cannot carry."""
        vocab = int(self.control.vocab_size)
        if vocab and len(token_class) != vocab:
            raise ValueError(f"grammar tables over {len(token_class)} tokens, the engine's vocabulary has {vocab}")
        if len(token_class) + next_state.size > self.slot_words:
            raise ValueError(f"grammar tables of {len(token_class) + next_state.size} words exceed a staging slot "
                             f"({self.slot_words})")
        with self._lock:
            index = self._by_key.get(key)
            if index is None:
                index = self._victim()
                slot = self._slots[index]
                self._by_key.pop(slot.key, None)
                self._gen += 1
                n = len(token_class)
                # The slot's bytes go before the descriptor that names it (x86-64 store order; the GPU reads
                # them after its acquire load of the ingress tail).
                self.words[index, :n] = token_class
                self.words[index, n:n + next_state.size] = next_state.reshape(-1)
                slot.key, slot.gen, (slot.states, slot.classes) = key, self._gen, next_state.shape
                self._by_key[key] = index
            slot = self._slots[index]
            slot.reserved += 1
            self._touch(slot)
            return index

    def unreserve(self, key) -> None:
        with self._lock:
            slot = self._slots[self._by_key[key]]
            if slot.reserved <= 0:
                raise ValueError("unreserve without a reservation")
            slot.reserved -= 1

    def bind(self, req_id: int, key) -> tuple[int, int, int, int]:
        """The request `req_id` is submitted with `key` (resident: reserve first): it holds the slot until its
        last record. Returns the descriptor's (grammar_slot, grammar_states, grammar_classes, grammar_gen)."""
        with self._lock:
            index = self._by_key.get(key)
            if index is None:
                raise ValueError("the constraint's tables were not staged (reserve them before submitting)")
            if req_id in self._by_request:
                raise ValueError(f"request id {req_id} already holds a grammar staging slot")
            slot = self._slots[index]
            slot.requests.add(req_id)
            self._by_request[req_id] = index
            self._touch(slot)
            return index, slot.states, slot.classes, slot.gen

    def finished(self, req_id: int) -> None:
        """The request's last egress record arrived: the GPU reads its tables no more."""
        with self._lock:
            index = self._by_request.pop(req_id, None)
            if index is not None:
                self._slots[index].requests.discard(req_id)

    def held_keys(self) -> set:
        with self._lock:
            return {s.key for s in self._slots if s.held}

    def slot_of(self, key) -> int | None:
        with self._lock:
            return self._by_key.get(key)

    def _victim(self) -> int:
        free = [i for i, s in enumerate(self._slots) if not s.held]
        if not free:
            raise StagingFull(f"all {self.num_slots} grammar arena partitions are in use by other constrained "
                              "requests; retry shortly")
        return min(free, key=lambda i: (self._slots[i].gen != 0, self._slots[i].last_used))  # unused, then LRU

    def _touch(self, slot: _Slot) -> None:
        self._tick += 1
        slot.last_used = self._tick
