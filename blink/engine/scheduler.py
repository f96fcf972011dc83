"""Host-mode scheduler: FCFS continuous batching with chunked prefill and preemption by recompute.

Each step: running decodes first, then running prefill chunks, then new admissions, all under a token
budget (max_num_batched_tokens) and a sequence cap (max_num_seqs). KV blocks are allocated as sequences
grow; when they run out, the newest running sequence is preempted (blocks freed, requeued at the front,
recomputed later) - never failed or dropped.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from blink.engine.kv_cache import BlockAllocator
from blink.engine.sequence import SeqStatus, Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int  # first token position run this step
    num_tokens: int
    samples: bool = field(init=False)  # reaches the end of the sequence, so a token is sampled after it

    def __post_init__(self):
        self.samples = self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk]
    admitted: list[Sequence]  # newly (re-)admitted this step: their sampling slots need setting

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.blocks = BlockAllocator(num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) wherever it is and free its blocks and slot."""
        if seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        elif seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED

    def _release(self, seq: Sequence) -> None:
        self.blocks.free(seq.block_ids)
        if seq.slot >= 0:
            self._free_slots.append(seq.slot)
            seq.slot = -1

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- one step -----------------------------------------------------------------------------------
    def _blocks_needed(self, seq: Sequence, upto: int) -> int:
        return max(0, -(-upto // self.block_size) - len(seq.block_ids))

    def _grow(self, seq: Sequence, upto: int) -> bool:
        new = self.blocks.allocate(self._blocks_needed(seq, upto))
        if new is None:
            return False
        seq.block_ids.extend(new)
        return True

    def schedule(self) -> StepPlan:
        budget = self.token_budget
        chunks: list[ScheduledChunk] = []
        # Decodes first, then running prefill chunks; both in admission order.
        order = [s for s in self.running if s.is_decode] + [s for s in self.running if not s.is_decode]
        for seq in order:
            if budget == 0:
                break
            if seq.status != SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.remaining, budget)
            while not self._grow(seq, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                # The victim may already hold a chunk this step (decodes go first): take it back.
                for c in [c for c in chunks if c.seq is victim]:
                    chunks.remove(c)
                    budget += c.num_tokens
                if victim is seq:
                    break
            if seq.status == SeqStatus.RUNNING:
                chunks.append(ScheduledChunk(seq, seq.num_computed, n))
                budget -= n
        admitted = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.remaining, budget)
            if not self._grow(seq, seq.num_computed + n):
                break  # wait for blocks; never preempt running work to admit new work
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            seq.slot = self._free_slots.pop()
            self.running.append(seq)
            admitted.append(seq)
            chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n
        return StepPlan(chunks, admitted)

    def complete(self, plan: StepPlan) -> None:
        """Mark the planned tokens as computed (their K/V are now in the cache)."""
        for c in plan.chunks:
            c.seq.num_computed = c.start + c.num_tokens
