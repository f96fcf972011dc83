"""FROZEN: the sampler as of git e896288 (one program per row for the keep thresholds and the top-K
logprobs), kept verbatim below this note as the "old" column of bench/kernels/sampler.py. Not imported by
blink; it shares sampling_select.keep_threshold_kernel / write_top_logprobs with the fallback of today's
pipeline, which kept them unchanged.
"""
# Token sampling over per-slot parameters (blink/kernels/sampling_state.py), CUDA-graph capturable.
#
# The semantics are sampling_ref's (order, exponential race, thresholds, raw logprobs); this is its Triton
# pipeline, equal to it token for token. Four launches, fixed grids, no host sync:
#   1. penalties: rows whose slot has penalties or logit_bias get processed logits in a side buffer; the
#      other rows return at once, so their logits are never copied.
#   2. keep thresholds (sampling_select): rows with temperature > 0 and some filter (top_k, top_p < 1,
#      min_p > 0) search their threshold by bisection; every other row writes -inf and returns.
#   3. choose: the vocabulary split in chunks over many programs; each runs the race (or the argmax of a
#      greedy row) and an online log-sum-exp of the raw logits over its chunk.
#   4. finish: one program per row merges the chunks: the token, its raw logprob and, for rows whose slot
#      asks (num_logprobs > 0), the top-K logprobs by a sort-free selection.
# A row whose slot is -1 is padding: greedy, no penalties, no top logprobs. The kernels take the vocabulary
# size as a compile-time constant: one compile per model (and the interpreter cannot loop up to a runtime
# scalar). FMA contraction is off so that every product rounds as in the torch reference.
#
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from blink.kernels.sampling_grammar import _FLAG_GRAMMAR, grammar_allowed
from blink.kernels.sampling_ref import (  # noqa: F401 (re-exported: the reference lives there)
    SampleOutput,
    apply_penalties_ref,
    choose_tokens_ref,
    keep_thresholds,
    sample_ref,
)
from blink.kernels.sampling_rng import KEY_BYTES, race_uniform, race_uniform_ref, row_hash  # noqa: F401
from blink.kernels.sampling_select import canonical, keep_threshold_kernel, sortable_key, write_top_logprobs

if TYPE_CHECKING:
    from blink.kernels.sampling_state import SamplingState

_NO_FUSION = {"enable_fp_fusion": False}
_ROW_WARPS = 16  # one program per row: as many loads in flight as an SM takes
_INT32_MAX = tl.constexpr(0x7FFFFFFF)


# ---- 1. logit_bias and penalties, only for the rows that have them --------------------------------
@triton.jit
def _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence):
    seen = (count > 0) | (in_prompt != 0)
    x = tl.where(seen, tl.where(x > 0, x * inv_repetition, x * repetition), x)
    return x - frequency * count.to(tl.float32) - presence * (count > 0).to(tl.float32)


@triton.jit
def _penalties_kernel(logits_ptr, out_ptr, slots_ptr, flags_ptr, repetition_ptr, frequency_ptr, presence_ptr,
                      counts_ptr, prompt_mask_ptr, bias_ids_ptr, bias_vals_ptr, gstate_ptr, gid_ptr, classes_ptr,
                      row_base_ptr, cells_ptr, vocab_size: tl.constexpr, NUM_BIAS: tl.constexpr,
                      BIAS_BLOCK: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk_start = tl.program_id(1) * CHUNK
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    flags = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0)
    if flags != 0:
        has_penalties = (flags & 1) != 0
        has_grammar = (flags & _FLAG_GRAMMAR) != 0
        gstate = tl.load(gstate_ptr + safe_slot)
        gid = tl.load(gid_ptr + safe_slot)
        repetition = tl.load(repetition_ptr + safe_slot)
        inv_repetition = tl.math.div_rn(1.0, repetition)
        frequency = tl.load(frequency_ptr + safe_slot)
        presence = tl.load(presence_ptr + safe_slot)
        in_row = logits_ptr + row.to(tl.int64) * vocab_size
        out_row = out_ptr + row.to(tl.int64) * vocab_size
        history = safe_slot.to(tl.int64) * vocab_size  # row of output_counts / prompt_mask

        # Dense pass over this chunk: a copy unless the slot has penalties (then read its history).
        for start in range(0, CHUNK, BLOCK):
            offs = chunk_start + start + tl.arange(0, BLOCK)
            mask = offs < vocab_size
            x = tl.load(in_row + offs, mask=mask)
            if has_penalties:
                count = tl.load(counts_ptr + history + offs, mask=mask, other=0)
                in_prompt = tl.load(prompt_mask_ptr + history + offs, mask=mask, other=0)
                x = _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence)
            if has_grammar:  # before temperature and the filters: they see only allowed tokens
                allowed = grammar_allowed(offs, mask, gstate, gid, classes_ptr, row_base_ptr, cells_ptr, vocab_size)
                x = tl.where(allowed, x, float("-inf"))
            tl.store(out_row + offs, x, mask=mask)

        # Biased tokens of this chunk: bias comes first, so redo them from the raw logit.
        if (flags & 2) != 0:
            tl.debug_barrier()  # the dense pass's stores to these tokens must land before ours
            b = tl.arange(0, BIAS_BLOCK)
            ids = tl.load(bias_ids_ptr + safe_slot.to(tl.int64) * NUM_BIAS + b, mask=b < NUM_BIAS, other=-1)
            vals = tl.load(bias_vals_ptr + safe_slot.to(tl.int64) * NUM_BIAS + b, mask=b < NUM_BIAS, other=0.0)
            used = (ids >= chunk_start) & (ids < chunk_start + CHUNK)
            x = tl.load(in_row + ids, mask=used, other=0.0) + vals
            if has_penalties:
                count = tl.load(counts_ptr + history + ids, mask=used, other=0)
                in_prompt = tl.load(prompt_mask_ptr + history + ids, mask=used, other=0)
                x = _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence)
            if has_grammar:
                allowed = grammar_allowed(ids, used, gstate, gid, classes_ptr, row_base_ptr, cells_ptr, vocab_size)
                x = tl.where(allowed, x, float("-inf"))
            tl.store(out_row + ids, x, mask=used)


# ---- 3. choice and log-sum-exp, per chunk ---------------------------------------------------------
@triton.jit
def _choose_kernel(logits_ptr, processed_ptr, threshold_ptr, slots_ptr, positions_ptr, flags_ptr, temperature_ptr,
                   seed_ptr, part_max_ptr, part_sum_ptr, part_best_ptr, part_token_ptr, part_smallest_ptr,
                   part_largest_ptr, vocab_size: tl.constexpr, NUM_CHUNKS: tl.constexpr, KEY_BYTES: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    noisy = (temperature != 0.0) & (slot >= 0)
    processed = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0) != 0
    inv_temperature = tl.math.div_rn(1.0, tl.where(noisy, temperature, 1.0))  # rounded as torch's '/'
    threshold = tl.load(threshold_ptr + row)
    hash_of_row = row_hash(tl.load(seed_ptr + safe_slot), tl.load(positions_ptr + row))
    raw_row = logits_ptr + row.to(tl.int64) * vocab_size
    processed_row = processed_ptr + row.to(tl.int64) * vocab_size

    run_max = tl.full([BLOCK], float("-inf"), tl.float32)  # online log-sum-exp of the raw logits, per lane
    run_sum = tl.zeros([BLOCK], tl.float32)
    smallest = tl.full([BLOCK], _INT32_MAX, tl.int32)  # key range of the raw row, for the top-K search
    largest = tl.full([BLOCK], -_INT32_MAX - 1, tl.int32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)  # a lane keeps its first maximum
    best_token = tl.full([BLOCK], vocab_size, tl.int32)
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        valid = offs < vocab_size
        x = tl.load(raw_row + offs, mask=valid, other=float("-inf"))
        new_max = tl.maximum(run_max, x)
        pivot = tl.where(new_max == float("-inf"), 0.0, new_max)  # all -inf so far: both terms 0, no NaN
        run_sum = run_sum * tl.exp(run_max - pivot) + tl.exp(x - pivot)
        run_max = new_max
        key = sortable_key(canonical(x))
        smallest = tl.minimum(smallest, tl.where(valid, key, _INT32_MAX))
        largest = tl.maximum(largest, tl.where(valid, key, -_INT32_MAX - 1))

        score = x
        if processed:
            score = tl.load(processed_row + offs, mask=valid, other=float("-inf"))
        if noisy:
            u = race_uniform(hash_of_row, offs, KEY_BYTES)
            score = tl.where(score >= threshold, score * inv_temperature - tl.log(-tl.log(u)), float("-inf"))
        take = score > best
        best = tl.where(take, score, best)
        best_token = tl.where(take, offs, best_token)

    chunk_max = tl.max(run_max, 0)
    scale = tl.exp(run_max - tl.where(chunk_max == float("-inf"), 0.0, chunk_max))
    top = tl.max(best, 0)
    out = row * NUM_CHUNKS + chunk
    tl.store(part_max_ptr + out, chunk_max)
    tl.store(part_sum_ptr + out, tl.sum(run_sum * scale, 0))
    tl.store(part_best_ptr + out, top)
    tl.store(part_token_ptr + out, tl.min(tl.where(best == top, best_token, vocab_size), 0))
    tl.store(part_smallest_ptr + out, tl.min(smallest, 0))
    tl.store(part_largest_ptr + out, tl.max(largest, 0))


# ---- 4. merge the chunks; logprobs ----------------------------------------------------------------
@triton.jit
def _finish_kernel(logits_ptr, scratch_ptr, slots_ptr, num_logprobs_ptr, part_max_ptr, part_sum_ptr,
                   part_best_ptr, part_token_ptr, part_smallest_ptr, part_largest_ptr, token_ptr, logprob_ptr,
                   top_ids_ptr, top_logprobs_ptr, vocab_size: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                   CHUNKS_PAD: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    part = row * NUM_CHUNKS + c
    in_range = c < NUM_CHUNKS
    chunk_max = tl.load(part_max_ptr + part, mask=in_range, other=float("-inf"))
    chunk_sum = tl.load(part_sum_ptr + part, mask=in_range, other=0.0)
    row_max = tl.max(chunk_max, 0)
    total = tl.sum(chunk_sum * tl.exp(chunk_max - tl.where(row_max == float("-inf"), 0.0, row_max)), 0)
    normalizer = row_max + tl.log(total)

    chunk_best = tl.load(part_best_ptr + part, mask=in_range, other=float("-inf"))
    chunk_token = tl.load(part_token_ptr + part, mask=in_range, other=vocab_size)
    token = tl.min(tl.where(chunk_best == tl.max(chunk_best, 0), chunk_token, vocab_size), 0)
    token = tl.where(token < vocab_size, token, 0)  # nothing finite anywhere: token 0, as argmax does
    raw_row = logits_ptr + row.to(tl.int64) * vocab_size
    tl.store(token_ptr + row, token.to(tl.int64))
    tl.store(logprob_ptr + row, tl.load(raw_row + token) - normalizer)

    if K > 0:
        slot = tl.load(slots_ptr + row)
        asks = (slot >= 0) & (tl.load(num_logprobs_ptr + tl.maximum(slot, 0)) > 0)
        ids_out = top_ids_ptr + row.to(tl.int64) * K
        logprobs_out = top_logprobs_ptr + row.to(tl.int64) * K
        if asks:
            chunk_largest = tl.load(part_largest_ptr + part, mask=in_range, other=-_INT32_MAX - 1)
            if NUM_CHUNKS >= K:
                # The K-th largest chunk maximum: K elements reach it, so the K-th largest element does too.
                ordered = tl.sort(chunk_largest, 0, descending=True)
                floor = tl.max(tl.where(c == K - 1, ordered, -_INT32_MAX - 1), 0)
            else:
                floor = tl.min(tl.load(part_smallest_ptr + part, mask=in_range, other=_INT32_MAX), 0)
            write_top_logprobs(raw_row, scratch_ptr + row.to(tl.int64) * vocab_size, floor, tl.max(chunk_largest, 0),
                               normalizer, ids_out, logprobs_out, vocab_size, K, K_PAD, BLOCK)
        else:
            k = tl.arange(0, K_PAD)
            tl.store(ids_out + k, tl.full([K_PAD], -1, tl.int64), mask=k < K)
            tl.store(logprobs_out + k, tl.full([K_PAD], float("-inf"), tl.float32), mask=k < K)


# ---- launches -------------------------------------------------------------------------------------
def _chunk_size(num_rows: int, vocab_size: int) -> int:
    """Vocabulary per choose/penalties program: about 256 programs in all, 2k..32k tokens each."""
    smallest = max(16, min(2048, triton.next_power_of_2(vocab_size) // 4))
    wanted = triton.next_power_of_2(triton.cdiv(vocab_size, max(1, 256 // num_rows)))
    return max(smallest, min(32768, wanted))


def _row_block(vocab_size: int) -> int:
    """BLOCK of the one-program-per-row searches (a few blocks per row even in small tests)."""
    return max(16, min(4096, triton.next_power_of_2(vocab_size) // 4))


def _penalized_rows(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """[S, V] processed logits; only rows whose slot has flags != 0 are written."""
    num_rows, vocab_size = logits.shape
    out = torch.empty_like(logits)
    chunk = _chunk_size(num_rows, vocab_size)
    num_bias = state.bias_ids.shape[1]
    _penalties_kernel[(num_rows, triton.cdiv(vocab_size, chunk))](
        logits, out, slots, state.flags, state.repetition_penalty, state.frequency_penalty,
        state.presence_penalty, state.output_counts, state.prompt_mask, state.bias_ids, state.bias_vals,
        state.grammar_state, state.grammar_id, state.grammar_classes, state.grammar_row_base, state.grammar_cells,
        vocab_size, NUM_BIAS=num_bias, BIAS_BLOCK=triton.next_power_of_2(num_bias), CHUNK=chunk,
        BLOCK=min(chunk, 1024), num_warps=4, **_NO_FUSION,
    )
    return out


def _keep_thresholds_triton(logits, processed, scratch, slots, state) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    out = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    keep_threshold_kernel[(num_rows,)](
        logits, processed, scratch, out, slots, state.flags, state.temperature, state.top_k, state.top_p,
        state.min_p, vocab_size, BLOCK=_row_block(vocab_size), num_warps=_ROW_WARPS, **_NO_FUSION,
    )
    return out


def _choose_and_score(logits, processed, threshold, scratch, slots, positions, state,
                      max_top_logprobs) -> SampleOutput:
    num_rows, vocab_size = logits.shape
    assert max_top_logprobs <= vocab_size
    device = logits.device
    chunk = _chunk_size(num_rows, vocab_size)
    num_chunks = triton.cdiv(vocab_size, chunk)
    part_f32 = torch.empty(3, num_rows, num_chunks, dtype=torch.float32, device=device)
    part_i32 = torch.empty(3, num_rows, num_chunks, dtype=torch.int32, device=device)
    _choose_kernel[(num_rows, num_chunks)](
        logits, processed, threshold, slots, positions, state.flags, state.temperature, state.seed,
        part_f32[0], part_f32[1], part_f32[2], part_i32[0], part_i32[1], part_i32[2], vocab_size,
        NUM_CHUNKS=num_chunks, KEY_BYTES=KEY_BYTES, CHUNK=chunk, BLOCK=min(chunk, 1024), num_warps=4,
        **_NO_FUSION,
    )
    token_ids = torch.empty(num_rows, dtype=torch.int64, device=device)
    logprobs = torch.empty(num_rows, dtype=torch.float32, device=device)
    top_ids = torch.empty(num_rows, max_top_logprobs, dtype=torch.int64, device=device)
    top_logprobs = torch.empty(num_rows, max_top_logprobs, dtype=torch.float32, device=device)
    _finish_kernel[(num_rows,)](
        logits, scratch, slots, state.num_logprobs, part_f32[0], part_f32[1], part_f32[2], part_i32[0],
        part_i32[1], part_i32[2], token_ids, logprobs, top_ids, top_logprobs, vocab_size, NUM_CHUNKS=num_chunks,
        CHUNKS_PAD=triton.next_power_of_2(num_chunks), K=max_top_logprobs,
        K_PAD=triton.next_power_of_2(max(max_top_logprobs, 1)), BLOCK=_row_block(vocab_size), num_warps=_ROW_WARPS,
        **_NO_FUSION,
    )
    return SampleOutput(token_ids, logprobs, top_ids, top_logprobs)


def _scratch(logits: torch.Tensor) -> torch.Tensor:
    """Where the searches gather their candidates: a row per row (written only by rows that search)."""
    return torch.empty_like(logits)


# ---- pieces on their own (tests, benchmark) and the whole step ------------------------------------
def apply_penalties_triton(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    flagged = torch.where(slots >= 0, state.flags[slots.clamp(min=0).long()], 0) != 0
    return torch.where(flagged[:, None], _penalized_rows(logits, slots, state), logits)


def keep_thresholds_triton(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """keep_thresholds on already processed logits."""
    return _keep_thresholds_triton(logits, logits, _scratch(logits), slots, state)


def choose_tokens_triton(logits: torch.Tensor, threshold: torch.Tensor, slots: torch.Tensor,
                         positions: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """choose_tokens_ref on already processed logits."""
    return _choose_and_score(logits, logits, threshold, _scratch(logits), slots, positions, state, 0).token_ids


def sample_triton(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
                  max_top_logprobs: int) -> SampleOutput:
    assert logits.shape[1] == state.vocab_size, "logits and sampling state disagree on the vocab size"
    logits = logits.float().contiguous()
    processed = _penalized_rows(logits, slots, state)
    scratch = _scratch(logits)
    threshold = _keep_thresholds_triton(logits, processed, scratch, slots, state)
    return _choose_and_score(logits, processed, threshold, scratch, slots, positions, state, max_top_logprobs)


def sample(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
           max_top_logprobs: int) -> SampleOutput:
    """logits [S, V] f32, slots [S] int32 (-1: padding), positions [S] int64 (of the sampled token)."""
    impl = sample_triton if logits.is_cuda else sample_ref
    return impl(logits, slots, positions, state, max_top_logprobs)
