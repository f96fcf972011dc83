"""Per-slot sampling parameters in persistent tensors, written once when a request is admitted.

A running request holds one slot from admission to finish. A step only tells the sampler which slot each
row belongs to (blink/kernels/sampling.py), so nothing per request is copied per step and the step can
be a CUDA graph. Device mode's scheduler kernel writes admissions straight into these tensors, so their
names, dtypes and shapes are a contract (all contiguous, dimension 0 = slot):

| tensor | dtype, shape | meaning |
| --- | --- | --- |
| temperature | f32 [slots] | 0 = greedy (argmax of the processed logits) |
| top_p | f32 [slots] | 1 = off |
| top_k | i32 [slots] | 0 = off |
| min_p | f32 [slots] | 0 = off |
| presence_penalty | f32 [slots] | subtracted once from every token already in the output |
| frequency_penalty | f32 [slots] | subtracted once per occurrence in the output |
| repetition_penalty | f32 [slots] | tokens in prompt or output: logit > 0 ? logit / rp : logit * rp |
| seed | i64 [slots] | RNG key; the uniform for a token is a hash of (seed, position, token id) |
| bias_ids | i32 [slots, MAX_LOGIT_BIAS] | logit_bias token ids, -1 padded |
| bias_vals | f32 [slots, MAX_LOGIT_BIAS] | logit_bias values (0 where the id is -1) |
| output_counts | i32 [slots, vocab] | occurrences of each token in the output so far |
| prompt_mask | u8 [slots, vocab] | 1 for tokens that occur in the prompt |
| flags | i32 [slots] | bit 0 (FLAG_PENALTIES): penalties; bit 1 (FLAG_LOGIT_BIAS): bias_ids; bit 2 (FLAG_GRAMMAR) |
| num_logprobs | i32 [slots] | top logprobs the request asks for (SamplingParams.logprobs, None -> 0); 0 = none |
| grammar_state | i32 [slots] | global DFA state (read under FLAG_GRAMMAR; -1: only EOS allowed) |
| grammar_id | i32 [slots] | row of grammar_classes |

The grammar arena (blink/grammar/arena.py: grammar_slots equal partitions, sized once by
grammar_arena_bytes): grammar_classes i32 [grammar_slots, vocab] (token -> class), grammar_row_base
i32 [slots * states per slot] (a state's first cell), grammar_cells i32 [slots * cells per slot] (next
global state per (state, class), -1 = disallowed). The
sampler masks a constrained row with these tables and advance_grammar moves grammar_state after it.

output_counts and prompt_mask rows are read and updated only while the slot's FLAG_PENALTIES bit is
set: admitting a request with penalties must zero both rows and then fill them; admitting one without
may leave them stale. The sampler computes top logprobs only for rows whose slot has num_logprobs > 0
(it then fills all max_top_logprobs columns; other rows get ids -1 and logprobs -inf). A slot never
admitted is greedy with no penalties and no logprobs, so it can serve as a padding row (slot -1 works
too: greedy, no penalties, never counted).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from blink.kernels import sampling_record
from blink.kernels.sampling_grammar import FLAG_GRAMMAR  # the flags' bits, each defined by its reader
from blink.kernels.sampling_record import FLAG_PENALTIES
from blink.request import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingParams

FLAG_LOGIT_BIAS = 2


def _as_int64(seed: int) -> int:
    """Any Python int as the signed 64-bit value with the same low 64 bits."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


class SamplingState:
    # The grammar tensors (shapes from the arena's geometry, not layout()'s): the device scheduler writes
    # them at admission too (csrc/sched_grammar.h), so structs.SamplingPtrs carries them after layout()'s.
    GRAMMAR_TENSORS = (("grammar_state", torch.int32), ("grammar_id", torch.int32), ("grammar_classes", torch.int32),
                       ("grammar_row_base", torch.int32), ("grammar_cells", torch.int32))

    @staticmethod
    def layout(max_slots: int, vocab_size: int) -> list[tuple[str, tuple, torch.dtype, float]]:
        """(tensor, shape, dtype, initial fill) in the table's order: the one definition of these tensors,
        which blink/device/structs.py SamplingPtrs (and so csrc/sched_types.h) mirrors."""
        f32, i32, i64, u8 = torch.float32, torch.int32, torch.int64, torch.uint8
        s = (max_slots,)
        return [("temperature", s, f32, 0), ("top_p", s, f32, 1.0), ("top_k", s, i32, 0), ("min_p", s, f32, 0),
                ("presence_penalty", s, f32, 0), ("frequency_penalty", s, f32, 0),
                ("repetition_penalty", s, f32, 1.0), ("seed", s, i64, 0),
                ("bias_ids", (max_slots, MAX_LOGIT_BIAS), i32, -1), ("bias_vals", (max_slots, MAX_LOGIT_BIAS), f32, 0),
                ("output_counts", (max_slots, vocab_size), i32, 0), ("prompt_mask", (max_slots, vocab_size), u8, 0),
                ("flags", s, i32, 0), ("num_logprobs", s, i32, 0)]

    def __init__(self, max_slots: int, vocab_size: int, device: torch.device | str, grammar_arena_bytes: int = 0):
        self.max_slots = max_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        for name, shape, dtype, fill in self.layout(max_slots, vocab_size):
            setattr(self, name, torch.full(shape, fill, dtype=dtype, device=self.device))
        # Structured outputs (GRAMMAR_TENSORS): each slot's automaton state and table, then the table arena.
        self.grammar_state = torch.full((max_slots,), -1, dtype=torch.int32, device=self.device)
        self.grammar_id = torch.zeros(max_slots, dtype=torch.int32, device=self.device)
        self._allocate_grammar_arena(grammar_arena_bytes)

    def _allocate_grammar_arena(self, nbytes: int) -> None:
        from blink.grammar.arena import arena_geometry

        self.grammar_slots, states, cells = arena_geometry(self.vocab_size, nbytes)
        self.grammar_states_per_slot, self.grammar_cells_per_slot = states, cells
        g, dev = max(self.grammar_slots, 1), self.device
        self.grammar_classes = torch.zeros(g, self.vocab_size, dtype=torch.int32, device=dev)
        self.grammar_row_base = torch.zeros(g * max(states, 1), dtype=torch.int32, device=dev)
        self.grammar_cells = torch.full((g * max(cells, 1),), -1, dtype=torch.int32, device=dev)

    def set_slot(self, slot: int, params: SamplingParams, seed: int, prompt_ids: Sequence[int],
                 output_ids: Sequence[int] = (), grammar: tuple[int, int] | None = None) -> None:
        """Admit (or re-admit after preemption, with the tokens generated so far) a request into `slot`.

        Host-side and synchronous; not for use inside a captured graph. The caller picks `seed` (the
        request's own, or a random one when params.seed is None). grammar: (grammar id, global state
        after output_ids) from GrammarArena, for a constrained request.
        """
        if not 0 <= slot < self.max_slots:
            raise ValueError(f"slot {slot} out of range [0, {self.max_slots})")
        bias_ids = [int(t) for t in params.logit_bias]
        if any(not 0 <= t < self.vocab_size for t in bias_ids):
            raise ValueError(f"logit_bias token ids must be in [0, {self.vocab_size})")
        has_penalties = (params.presence_penalty != 0 or params.frequency_penalty != 0
                         or params.repetition_penalty != 1)
        flags = (FLAG_PENALTIES if has_penalties else 0) | (FLAG_LOGIT_BIAS if bias_ids else 0)
        flags |= FLAG_GRAMMAR if grammar is not None else 0
        gid, gstate = grammar if grammar is not None else (0, -1)

        scalars = [
            (self.temperature, params.temperature), (self.top_p, params.top_p), (self.top_k, params.top_k),
            (self.min_p, params.min_p), (self.presence_penalty, params.presence_penalty),
            (self.frequency_penalty, params.frequency_penalty),
            (self.repetition_penalty, params.repetition_penalty), (self.seed, _as_int64(seed)),
            (self.flags, flags), (self.num_logprobs, min(params.logprobs or 0, MAX_TOP_LOGPROBS)),
            (self.grammar_id, gid), (self.grammar_state, gstate),
        ]
        for tensor, value in scalars:
            tensor[slot] = value

        self.bias_ids[slot] = -1
        self.bias_vals[slot] = 0.0
        if bias_ids:
            n = len(bias_ids)
            self.bias_ids[slot, :n] = torch.tensor(bias_ids, dtype=torch.int32)
            self.bias_vals[slot, :n] = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)

        # Zeroed for every admission (cheap here) so that a reused slot never shows stale history.
        self.output_counts[slot] = 0
        self.prompt_mask[slot] = 0
        if has_penalties:
            prompt = torch.as_tensor(list(prompt_ids), dtype=torch.int64, device=self.device)
            self.prompt_mask[slot, prompt] = 1
            output = torch.as_tensor(list(output_ids), dtype=torch.int64, device=self.device)
            self.output_counts[slot].index_add_(0, output, torch.ones_like(output, dtype=torch.int32))

    def record_tokens(self, slots: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Count each row's new token in its slot's output_counts. CUDA-graph capturable.

        Rows whose slot is negative, whose token is negative, or whose slot has no penalties are
        skipped (they add 0), so padding rows may point anywhere valid or at -1.
        """
        sampling_record.record_tokens(self.output_counts, self.flags, FLAG_PENALTIES, slots, token_ids)
