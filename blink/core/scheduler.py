"""The scheduler: FCFS continuous batching with chunked prefill and preemption by recompute.

Its contract is vLLM v1's: `schedule()` decides a step (a SchedulerOutput), the runner runs it, and
`update_from_output(output, sampled)` applies the result: marks the tokens computed, appends the sampled
tokens, checks stops and finishes requests, returning one TokenEvent per sampled token. Host mode runs it
on the CPU; device mode's C++ scheduler (blink/device/csrc/sched.h) has the same two phases, `schedule` and
`update_from_output`, and tests/device checks that it makes the same decisions step for step.

Each step: running decodes first, then running prefill chunks, then new admissions, all under a token
budget (max_num_batched_tokens) and a sequence cap (max_num_seqs). KV blocks are allocated as sequences
grow; when they run out, the newest running sequence is preempted (blocks freed, requeued at the front,
recomputed later) - never failed or dropped.

With prefix caching (blink/core/prefix_cache.py), an admission first takes the longest cached prefix of
full blocks (shared, reference-counted) and prefills only the rest; blocks a step fills are indexed after
it; finished, aborted and preempted sequences drop their references, and cached blocks nobody holds wait
in an LRU until a fresh block is needed.

Prompt logprobs: a step has at most `prompt_logprob_rows` logits rows for prompt positions (fixed graph
shapes), so a chunk of a request that asks for them is cut to fit the rows left, and waits when none are.
Such a request skips the prefix cache (its cached positions would have no logits) until its first token.
"""
from __future__ import annotations

import sys
from collections import deque

from blink.core.kv_cache import BlockAllocator
from blink.core.outputs import SampledToken, ScheduledChunk, SchedulerOutput
from blink.core.prefix_cache import NO_PARENT, PrefixCache
from blink.core.sequence import SeqStatus, Sequence
from blink.core.stops import check_stop
from blink.request import FinishReason, TokenEvent


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None = None, eos_token_ids: tuple[int, ...] = (),
                 enable_prefix_caching: bool = False, prompt_logprob_rows: int = 0):
        """max_model_len None: no context limit (scheduler unit tests)."""
        self.max_model_len = max_model_len or sys.maxsize
        self.eos_token_ids = tuple(eos_token_ids)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.prompt_logprob_rows = prompt_logprob_rows
        self.blocks = BlockAllocator(num_blocks)
        self.prefix_cache = PrefixCache(self.blocks, block_size) if enable_prefix_caching else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self.requests: dict[int, Sequence] = {}  # every unfinished request, waiting or running
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.num_preemptions = 0

    @classmethod
    def from_limits(cls, limits, eos_token_ids: tuple[int, ...]) -> Scheduler:
        """limits: blink.core.limits.EngineLimits."""
        return cls(limits.num_kv_blocks, limits.block_size, limits.max_num_seqs, limits.max_num_batched_tokens,
                   limits.max_model_len, eos_token_ids, limits.enable_prefix_caching, limits.prompt_logprob_rows)

    # -- queue management -------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.req_id in self.requests:
            raise ValueError(f"request id {seq.req_id} is already in use")
        self.requests[seq.req_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, req_id: int) -> TokenEvent | None:
        """Stop a waiting or running request and free what it holds: its ABORT event (None if unknown)."""
        seq = self.requests.get(req_id)
        if seq is None:
            return None  # finished already, or never existed: nothing to free
        self._finish(seq)
        return TokenEvent(req_id, -1, len(seq.output_ids), FinishReason.ABORT,
                          cached_tokens=max(0, seq.num_cached_tokens))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (POST /reset_prefix_cache); False when prefix caching is off."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.reset()
        return True

    def _finish(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) wherever it is and free its blocks and slot."""
        del self.requests[seq.req_id]
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

    @staticmethod
    def _prompt_cap(seq: Sequence, start: int, n: int, rows_left: int) -> int:
        """n cut so the chunk's prompt-logprob rows fit in rows_left (0: the chunk waits this step)."""
        return n if seq.prompt_rows(start, n) <= rows_left else rows_left

    def schedule(self) -> SchedulerOutput:
        budget = self.token_budget
        rows_left = self.prompt_logprob_rows
        chunks: list[ScheduledChunk] = []
        # Decodes first, then running prefill chunks; both in admission order.
        order = [s for s in self.running if s.is_decode] + [s for s in self.running if not s.is_decode]
        for seq in order:
            if budget == 0:
                break
            if seq.status != SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = self._prompt_cap(seq, seq.num_computed, min(seq.remaining, budget), rows_left)
            if n == 0:
                continue
            while not self._grow(seq, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                # The victim may already hold a chunk this step (decodes go first): take it back.
                for c in [c for c in chunks if c.seq is victim]:
                    chunks.remove(c)
                    budget += c.num_tokens
                    rows_left += c.num_prompt_rows
                if victim is seq:
                    break
            if seq.status == SeqStatus.RUNNING:
                chunks.append(ScheduledChunk(seq, seq.num_computed, n))
                budget -= n
                rows_left -= chunks[-1].num_prompt_rows
        admitted = []
        cache = self.prefix_cache
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.blocks.num_free == 0:
                break  # any admission needs a fresh block (for its last token at least): skip the match
            use_cache = cache is not None and not seq.wants_prompt_logprobs
            hit = cache.match(seq) if use_cache else None
            cached = len(hit.blocks) * self.block_size if hit else 0
            n = self._prompt_cap(seq, cached, min(seq.num_tokens - cached, budget), rows_left)
            if n == 0:
                break  # FCFS: it waits for a step with prompt-logprob rows left
            need = -(-(cached + n) // self.block_size) - (len(hit.blocks) if hit else 0)
            if need > self.blocks.num_free - (hit.num_in_lru if hit else 0):
                break  # wait for blocks; never preempt running work to admit new work
            if use_cache:
                cache.admit(seq, hit)  # before growing: the hit's blocks leave the LRU, never evicted here
            else:
                if seq.num_cached_tokens < 0:
                    seq.num_cached_tokens = 0
                seq.num_hashed, seq.chain_hash, seq.chain_parent = 0, 0, NO_PARENT  # its blocks chain afresh
            self._grow(seq, cached + n)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            seq.slot = self._free_slots.pop()
            self.running.append(seq)
            admitted.append(seq)
            chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n
            rows_left -= chunks[-1].num_prompt_rows
        return SchedulerOutput(chunks, admitted)

    def update_from_output(self, output: SchedulerOutput, sampled: list[SampledToken | None]) -> list[TokenEvent]:
        """After the step ran: its tokens' K/V are in the cache; append each sampled token (one per chunk,
        None for a chunk mid-prefill), check the stops and finish what stopped."""
        # The step's prompt events come first, in row order (the device's record order, csrc/sched_finish.h).
        events = [TokenEvent(c.seq.req_id, p.token_id, -p.index, FinishReason.NONE, p.logprob, p.top_ids,
                             p.top_logprobs, rank=p.rank)
                  for c, plps in zip(output.chunks, output.prompt_logprobs, strict=False) for p in plps]
        for c, tok in zip(output.chunks, sampled, strict=True):
            seq = c.seq
            seq.num_computed = c.start + c.num_tokens
            if self.prefix_cache:
                self.prefix_cache.register(seq)
            if tok is None:
                continue
            seq.output_ids.append(tok.token_id)
            reason = check_stop(seq.params, seq.output_ids, seq.num_tokens, self.eos_token_ids, self.max_model_len)
            k = seq.params.logprobs or 0
            events.append(TokenEvent(seq.req_id, tok.token_id, len(seq.output_ids) - 1, reason, tok.logprob,
                                     tok.top_ids[:k], tok.top_logprobs[:k], cached_tokens=seq.num_cached_tokens))
            if reason != FinishReason.NONE:
                self._finish(seq)
        return events
