"""Token sampling over per-slot parameters (blink/kernels/sampling_state.py), CUDA-graph capturable.

The semantics are sampling_ref's (order, exponential race, thresholds, raw logprobs); this is its Triton
pipeline, equal to it token for token. Fixed grids, no host sync; every kernel but the resolve and the
finish splits the vocabulary in the same chunks (256-1,024 programs in all, sampling_grid.programs_for):
  1. penalties: rows whose slot has penalties or logit_bias get processed logits in a side buffer (the
     other rows are never copied); rows with a filter also write each chunk's maximum, rows that ask for
     top-K logprobs each chunk's floor certificate (sampling_topk), and every row zeroes its scratch.
  (with the rejection, one round up to 8 rows unless BLINK_SAMPLER_REJECT says, step 1
     also races the rows it takes and sampling_reject's R rounds follow, in one launch on the GPU: a taken row
     whose race winner is kept within R rounds is decided, skips steps 2-4 and races a one-token list in step 6)
  2-5. keep thresholds (sampling_bucket): rows with temperature > 0 and some filter (top_k, top_p < 1,
     min_p > 0) bucket their tokens in two levels, gather the candidates (step 4 also gathers the top-K
     logprobs' candidates) and resolve the threshold exactly; every other row writes -inf.
  6. choose (sampling_choose.py, as step 7): each program runs the race (or the argmax of a greedy row) and an
     online log-sum-exp of the raw logits over its chunk; with the list race (BLINK_SAMPLER_RACE=list,
     sampling_race) a filtered row whose kept tokens the compaction listed races over its share of the list only
     (step 1 did its log-sum-exp).
  7. finish: one program per row merges the chunks: the token, its raw logprob and, for rows whose slot
     asks (num_logprobs > 0), the top-K logprobs from their candidates.
A row whose slot is -1 is padding: greedy, no penalties, no top logprobs. The kernels take the vocabulary
size as a compile-time constant: one compile per model (and the interpreter cannot loop up to a runtime
scalar). FMA contraction is off so that every product rounds as in the torch reference.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from blink.kernels.sampling_bucket import NUM_BUCKETS, _bucket_kernel, _refine_kernel
from blink.kernels.sampling_choose import _choose_kernel, _finish_kernel
from blink.kernels.sampling_compact import _compact_kernel
from blink.kernels.sampling_grammar_advance import advance_grammar
from blink.kernels.sampling_grid import _Plan, _row_block
from blink.kernels.sampling_penalties import prologue
from blink.kernels.sampling_ref import (  # noqa: F401 (re-exported: the reference lives there)
    SampleOutput,
    apply_penalties_ref,
    choose_tokens_ref,
    keep_thresholds,
    sample_ref,
)
from blink.kernels.sampling_reject import reject as reject_candidates
from blink.kernels.sampling_resolve import _resolve_kernel
from blink.kernels.sampling_rng import KEY_BYTES, race_uniform, race_uniform_ref, row_hash  # noqa: F401

if TYPE_CHECKING:
    from blink.kernels.sampling_state import SamplingState

_NO_FUSION = {"enable_fp_fusion": False}
_ROW_WARPS = 16  # one program per row: as many loads in flight as an SM takes


# ---- launches -------------------------------------------------------------------------------------
def _keep_thresholds_triton(logits, processed, slots, state, plan: _Plan, max_top_logprobs: int = 0) -> torch.Tensor:
    """Steps 2-5; the compaction also gathers the top-K logprobs' candidates when max_top_logprobs > 0."""
    num_rows, vocab_size = logits.shape
    params = (slots, state.flags, state.temperature, state.top_k, state.top_p, state.min_p, plan.reject_state)
    sizes = dict(NB=plan.num_buckets, P=plan.num_chunks, P_PAD=plan.chunks_pad, REJECT=plan.reject > 0)
    levels = dict(sizes, LOG2_NB=plan.log2_buckets)
    pdl = plan.pdl
    once = plan.compact_once  # the bucket and refine kernels keep each chunk's histograms for the compaction
    # The list or the one read took the compaction from 60 to 77 registers (sm_90's build): 3 programs of 8 warps an
    # SM instead of 4, a second wave at 512. At 64 ptxas spills nothing at S = 32's chunks (4 bytes at one row's,
    # where 63 programs fill no SM twice: left free there).
    compact_regs = {"maxnreg": 64} if (plan.race > 0 or once) and num_rows > 1 else {}
    _bucket_kernel[plan.grid](logits, processed, *params, plan.row_max, plan.kept_min, plan.part_total, plan.hist,
                              plan.chunk_hist, vocab_size, **sizes, CHUNK=plan.chunk, BLOCK=plan.block,
                              CHUNK_HIST=once and plan.race > 0, FLOOR=plan.topk_floor, num_warps=4, **pdl,
                              **_NO_FUSION)
    _refine_kernel[plan.grid](logits, processed, *params, plan.row_max, plan.part_total, plan.hist, plan.sums,
                              plan.counters, plan.row_plans, plan.chunk_hist, vocab_size, **levels, CHUNK=plan.chunk,
                              BLOCK=plan.block, CHUNK_HIST=once, FLOOR=plan.topk_floor, num_warps=4, **pdl,
                              **_NO_FUSION)
    _compact_kernel[plan.grid](logits, processed, *params, plan.row_max, plan.row_plans, plan.sums, plan.counters,
                               plan.cand_i32[0], state.num_logprobs, plan.top_keys, plan.part_i32[1],
                               plan.cand_i32[1], plan.cand_i32[2], plan.race_ids, plan.chunk_hist, plan.floor_keys,
                               vocab_size, **sizes, CAND=plan.cand, K=max_top_logprobs, CHUNK=plan.chunk,
                               BLOCK=plan.block, RACE=plan.race, ONCE=once, FLOOR=plan.topk_floor, num_warps=8,
                               **compact_regs, **pdl,
                               **_NO_FUSION)  # 8 warps: chosen when it also ran the plans' NB-wide scans
    out = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    _resolve_kernel[(num_rows,)](logits, processed, plan.scratch, out, plan.fell_back, *params, plan.row_max,
                                 plan.kept_min, plan.row_plans, plan.sums, plan.cand_i32[0], plan.race_count,
                                 plan.counters, vocab_size, P=plan.num_chunks, P_PAD=plan.chunks_pad, CAND=plan.cand,
                                 SMALL=plan.small, BLOCK=_row_block(vocab_size), RACE=plan.race,
                                 REJECT=plan.reject > 0, FLOOR=plan.topk_floor, num_warps=_ROW_WARPS, **pdl,
                                 **_NO_FUSION)
    return out


def _choose_and_score(logits, processed, threshold, slots, positions, state, max_top_logprobs,
                      plan: _Plan, out: SampleOutput | None = None, record: bool = False) -> SampleOutput:
    """threshold None: no search ran (sample_triton's `search`; the choice reads no threshold then)."""
    num_rows, vocab_size = logits.shape
    assert max_top_logprobs <= vocab_size
    device = logits.device
    f32, i32 = plan.part_f32, plan.part_i32
    searched = threshold is not None
    _choose_kernel[plan.grid](
        logits, processed, threshold if searched else logits, slots, positions, state.flags, state.temperature,
        state.seed,
        f32[0], f32[1], f32[2], i32[0], i32[2], plan.race_count, plan.race_ids, vocab_size,
        NUM_CHUNKS=plan.num_chunks, KEY_BYTES=KEY_BYTES, CHUNK=plan.chunk, BLOCK=plan.block, RACE=plan.race,
        RACE_BLOCK=plan.race_block, SEARCHED=searched, num_warps=4, **plan.pdl, **_NO_FUSION,
    )
    if out is None:
        out = SampleOutput(torch.empty(num_rows, dtype=torch.int64, device=device),
                           torch.empty(num_rows, dtype=torch.float32, device=device),
                           torch.empty(num_rows, max_top_logprobs, dtype=torch.int64, device=device),
                           torch.empty(num_rows, max_top_logprobs, dtype=torch.float32, device=device))
    token_ids, logprobs, top_ids, top_logprobs = out
    assert all(t.is_contiguous() for t in out) and top_ids.shape == (num_rows, max_top_logprobs)
    _finish_kernel[(num_rows,)](
        logits, plan.scratch, slots, state.num_logprobs, f32[0], f32[1], f32[2], i32[0], i32[1], i32[2], plan.top_keys,
        plan.counters, plan.cand_i32[1], plan.cand_i32[2], token_ids, logprobs, top_ids, top_logprobs, state.flags,
        state.output_counts, state.grammar_state, state.grammar_id, state.grammar_classes, state.grammar_row_base,
        state.grammar_cells, vocab_size, NUM_CHUNKS=plan.num_chunks, CHUNKS_PAD=plan.chunks_pad, K=max_top_logprobs,
        K_PAD=triton.next_power_of_2(max(max_top_logprobs, 1)), CAND=plan.cand, SMALL=plan.small,
        BLOCK=_row_block(vocab_size), RECORD=record, GRAMMAR=record and state.grammar_slots > 0,
        num_warps=_ROW_WARPS, **plan.pdl, **_NO_FUSION,
    )
    return out


# ---- pieces on their own (tests, benchmark) and the whole step ------------------------------------
def apply_penalties_triton(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    flagged = torch.where(slots >= 0, state.flags[slots.clamp(min=0).long()], 0) != 0
    out = torch.empty_like(logits)
    prologue(logits, out, slots, state, _Plan(logits, reject=0), penalize=True)
    return torch.where(flagged[:, None], out, logits)


def keep_thresholds_triton(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState,
                           num_buckets: int = NUM_BUCKETS, fell_back: torch.Tensor | None = None,
                           programs: int | None = None, race: int | None = None,
                           compact_once: bool | None = None) -> torch.Tensor:
    """keep_thresholds on already processed logits; `fell_back` [S] int32, if given, gets 1 for the rows that
    took the one-program search."""
    plan = _Plan(logits, num_buckets, programs, race, compact_once, reject=0)  # the thresholds themselves
    prologue(logits, logits, slots, state, plan, penalize=False)
    out = _keep_thresholds_triton(logits, logits, slots, state, plan)
    if fell_back is not None:
        fell_back.copy_(plan.fell_back)
    return out


def choose_tokens_triton(logits: torch.Tensor, threshold: torch.Tensor, slots: torch.Tensor,
                         positions: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """choose_tokens_ref on already processed logits (the row race: no compaction lists the kept tokens)."""
    plan = _Plan(logits, race=0)
    return _choose_and_score(logits, logits, threshold, slots, positions, state, 0, plan).token_ids


def penalize_and_reject(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
                        plan: _Plan, max_top_logprobs: int) -> torch.Tensor:
    """Step 1 and the rejection's rounds (when the plan has any): the processed logits; plan.reject_state then
    says which rows the rounds decided (the bench's --undecided counts the others)."""
    processed = torch.empty_like(logits)
    prologue(logits, processed, slots, state, plan, penalize=True, max_top_logprobs=max_top_logprobs,
             positions=positions)
    if plan.reject:
        reject_candidates(logits, processed, slots, positions, state, plan)
    return processed


def sample_triton(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
                  max_top_logprobs: int, num_buckets: int = NUM_BUCKETS, programs: int | None = None,
                  out: SampleOutput | None = None, race: int | None = None,
                  compact_once: bool | None = None, reject: int | None = None, record: bool = False,
                  topk_floor: bool | None = None, search: bool = True) -> SampleOutput:
    """race: the list race's capacity per row (sampling_grid.race_capacity; None: BLINK_SAMPLER_RACE's);
    compact_once: the compaction's one read (sampling_compact; None: BLINK_SAMPLER_COMPACT's); reject: the
    rejection's rounds before the search (sampling_reject; None: BLINK_SAMPLER_REJECT's); record: the state's
    updates after the choice too (sample's); topk_floor: top_k rows by the lane floor (sampling_floor; None:
    BLINK_SAMPLER_TOPK's); search=False: the penalties, choice and finish launches only (no rejection, no
    threshold search), for a batch whose rows have no filter and ask for no top-K logprobs
    (SamplingParams.needs_search says which rows may; any other row would be sampled as if it had none)."""
    assert logits.shape[1] == state.vocab_size, "logits and sampling state disagree on the vocab size"
    logits = logits.float().contiguous()
    plan = _Plan(logits, num_buckets, programs, race, compact_once, reject if search else 0, topk_floor)
    processed = penalize_and_reject(logits, slots, positions, state, plan, max_top_logprobs)
    threshold = _keep_thresholds_triton(logits, processed, slots, state, plan, max_top_logprobs) if search else None
    return _choose_and_score(logits, processed, threshold, slots, positions, state, max_top_logprobs, plan, out,
                             record)


def sample(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
           max_top_logprobs: int, out: SampleOutput | None = None, record: bool = False,
           search: bool = True) -> SampleOutput:
    """logits [S, V] f32, slots [S] int32 (-1: padding), positions [S] int64 (of the sampled token). With `out`
    (contiguous tensors of SampleOutput's dtypes, e.g. a step's buffers) the results land there, copy-free on
    CUDA. record: also count each row's token in its slot's penalty history and advance a constrained slot's DFA
    state (SamplingState.record_tokens, sampling_grammar_advance.advance_grammar; one row per constrained slot), on CUDA
    inside the last kernel. search=False (CUDA): without the threshold search's launches (sample_triton's; the CPU
    reference gives the same tokens either way)."""
    if logits.is_cuda:
        return sample_triton(logits, slots, positions, state, max_top_logprobs, out=out, record=record, search=search)
    got = sample_ref(logits, slots, positions, state, max_top_logprobs)
    if out is not None:
        for dst, src in zip(out, got, strict=True):
            dst.copy_(src)
        got = out
    if record:
        state.record_tokens(slots, got.token_ids)
        advance_grammar(slots, got.token_ids, state)
    return got
