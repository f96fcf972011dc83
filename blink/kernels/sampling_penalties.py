"""Step 1 of the sampler (sampling.py): logit_bias, penalties and the grammar's mask for the rows that have
them, into a side buffer; for the rows with a filter, each chunk's largest processed logit (with the list race,
sampling_race, also its raw log-sum-exp partials); and the zeroing of the selection's per-row scratch
(sampling_bucket, sampling_topk) for every row.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_bucket import is_filtered
from blink.kernels.sampling_floor import floor_row, store_floor_lanes
from blink.kernels.sampling_grammar import _FLAG_GRAMMAR, grammar_allowed
from blink.kernels.sampling_plan import COUNTERS, POOL_QUEUE, QUEUE_PER_ROW
from blink.kernels.sampling_race import lse_step, store_lse
from blink.kernels.sampling_reject import first_race, taken
from blink.kernels.sampling_rng import KEY_BYTES
from blink.kernels.sampling_select import canonical, sortable_key
from blink.kernels.sampling_topk import asks_for_logprobs, store_chunk_top

_NO_FUSION = {"enable_fp_fusion": False}
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
                      row_base_ptr, cells_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, key_max_ptr, hist_ptr,
                      sums_ptr, counter_ptr, num_logprobs_ptr, top_keys_ptr, part_smallest_ptr, part_max_ptr,
                      part_sum_ptr, part_largest_ptr, seed_ptr, positions_ptr, first_best_ptr, first_token_ptr,
                      first_mass_ptr, floor_keys_ptr, pool_words_ptr, vocab_size: tl.constexpr, NUM_BIAS: tl.constexpr,
                      BIAS_BLOCK: tl.constexpr,
                      PENALIZE: tl.constexpr, NB: tl.constexpr, P: tl.constexpr, ZERO: tl.constexpr, K: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr, RACE: tl.constexpr = 0, REJECT: tl.constexpr = False,
                      TOP_K: tl.constexpr = False, KEY_BYTES: tl.constexpr = 0, FLOOR: tl.constexpr = False,
                      POOL: tl.constexpr = False,
                      USE_PDL: tl.constexpr = False):
    """PENALIZE=0: the logits are already processed; only the chunk maxima and the zeroing. RACE > 0: rows with
    a filter also get the choose kernel's log-sum-exp partials here (sampling_race: their race may skip the row).
    REJECT: the rows the rejection takes (TOP_K: top_k-only rows too) get its first race (sampling_reject).
    FLOOR: top_k rows that take the lane floor (sampling_floor) also get their chunk's largest lane maxima.
    POOL: the rejection's later rounds over the launch's pool (sampling_reject_pool): its words are zeroed too."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk_start = tl.program_id(1) * CHUNK
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    flags = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0) * PENALIZE
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

    # The selection's per-row scratch starts at zero (this program's slice of both histogram levels, the sums).
    z = tl.program_id(1) * ZERO + tl.arange(0, ZERO)
    tl.store(hist_ptr + row * NB + z, tl.zeros([ZERO], tl.int32), mask=z < NB)
    if tl.program_id(1) == 0:
        tl.store(sums_ptr + row * 2 + tl.arange(0, 2), tl.zeros([2], tl.int64))
        tl.store(counter_ptr + row * COUNTERS + tl.arange(0, COUNTERS), tl.zeros([COUNTERS], tl.int32))
        if POOL:  # the rejection's pool words (sampling_reject_pool): row 0 its global ones, each row its queue's
            w = tl.arange(0, 128)
            tl.store(pool_words_ptr + w, tl.zeros([128], tl.int32), mask=(w < POOL_QUEUE) & (row == 0))
            q = tl.arange(0, QUEUE_PER_ROW)
            tl.store(pool_words_ptr + POOL_QUEUE + row * QUEUE_PER_ROW + q, tl.zeros([QUEUE_PER_ROW], tl.int32))
    # Rows with a filter: this chunk's largest processed logit (the buckets are relative to the row's).
    temperature = tl.load(temperature_ptr + safe_slot)
    top_k = tl.load(top_k_ptr + safe_slot)
    top_p = tl.load(top_p_ptr + safe_slot)
    min_p = tl.load(min_p_ptr + safe_slot)
    if is_filtered(slot, temperature, top_k, top_p, min_p):
        raw_row = logits_ptr + row.to(tl.int64) * vocab_size
        src = raw_row
        if flags != 0:
            tl.debug_barrier()  # this program's stores to the processed row land before it reads them back
            src = out_ptr + row.to(tl.int64) * vocab_size
        largest = tl.full([BLOCK], -_INT32_MAX - 1, tl.int32)
        run_max = tl.full([BLOCK], float("-inf"), tl.float32)  # RACE > 0: sampling_race.lse_step's state
        run_sum = tl.zeros([BLOCK], tl.float32)
        raw_largest = tl.full([BLOCK], -_INT32_MAX - 1, tl.int32)
        for start in range(0, CHUNK, BLOCK):
            offs = chunk_start + start + tl.arange(0, BLOCK)
            x = tl.load(src + offs, mask=offs < vocab_size, other=float("-inf"))
            largest = tl.maximum(largest, tl.where(offs < vocab_size, sortable_key(canonical(x)), -_INT32_MAX - 1))
            if RACE > 0:
                raw = x
                if flags != 0:
                    raw = tl.load(raw_row + offs, mask=offs < vocab_size, other=float("-inf"))
                run_max, run_sum, raw_largest = lse_step(run_max, run_sum, raw_largest, raw, offs < vocab_size)
        tl.store(key_max_ptr + row * P + tl.program_id(1), tl.max(largest, 0))
        if FLOOR:
            if floor_row(top_k, min_p, vocab_size, P):
                store_floor_lanes(floor_keys_ptr, row, tl.program_id(1), largest, P, BLOCK)
        if REJECT:
            if taken(True, top_k, top_p, TOP_K):  # the chunk is in the L1 / L2 now: the race reads it again
                part = row * P + tl.program_id(1)
                first_race(src, tl.program_id(1), tl.max(largest, 0), temperature, top_p, min_p,
                           tl.load(seed_ptr + safe_slot), tl.load(positions_ptr + row), first_best_ptr + part,
                           first_token_ptr + part, first_mass_ptr + part, vocab_size, KEY_BYTES, CHUNK, BLOCK)
        if RACE > 0:
            store_lse(part_max_ptr, part_sum_ptr, part_largest_ptr, row * P + tl.program_id(1), run_max, run_sum,
                      raw_largest)
    # Rows that ask for top-K logprobs: this chunk's floor keys (store_chunk_top) and smallest key, of the raw logits.
    if K > 0:
        if asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
            lanes = tl.full([BLOCK], -_INT32_MAX - 1, tl.int32)
            smallest = tl.full([BLOCK], _INT32_MAX, tl.int32)
            for start in range(0, CHUNK, BLOCK):
                offs = chunk_start + start + tl.arange(0, BLOCK)
                valid = offs < vocab_size
                key = sortable_key(canonical(tl.load(logits_ptr + row.to(tl.int64) * vocab_size + offs, mask=valid,
                                                     other=float("-inf"))))
                lanes = tl.maximum(lanes, tl.where(valid, key, -_INT32_MAX - 1))
                smallest = tl.minimum(smallest, tl.where(valid, key, _INT32_MAX))
            store_chunk_top(top_keys_ptr, row, tl.program_id(1), lanes, K, P, BLOCK)
            tl.store(part_smallest_ptr + row * P + tl.program_id(1), tl.min(smallest, 0))


def prologue(logits, out, slots, state, plan, penalize: bool, max_top_logprobs: int = 0, positions=None) -> None:
    """Penalties into `out` (penalize), the selection's chunk maxima and zeroing, for max_top_logprobs > 0 the
    top-K floor certificates and, for plan.reject > 0, the rejection's first race at `positions` (plan:
    sampling_grid._Plan)."""
    num_rows, vocab_size = logits.shape
    assert positions is not None or not plan.reject, "the rejection's race needs the rows' positions"
    num_bias = state.bias_ids.shape[1]
    _penalties_kernel[plan.grid](
        logits, out, slots, state.flags, state.repetition_penalty, state.frequency_penalty,
        state.presence_penalty, state.output_counts, state.prompt_mask, state.bias_ids, state.bias_vals,
        state.grammar_state, state.grammar_id, state.grammar_classes, state.grammar_row_base, state.grammar_cells,
        state.temperature, state.top_k, state.top_p, state.min_p, plan.row_max, plan.hist, plan.sums, plan.counters,
        state.num_logprobs, plan.top_keys, plan.part_i32[1], plan.part_f32[0], plan.part_f32[1], plan.part_i32[2],
        state.seed, slots if positions is None else positions, plan.reject_first_best, plan.reject_first_token,
        plan.reject_first_mass, plan.floor_keys, plan.pool_words, vocab_size, NUM_BIAS=num_bias,
        BIAS_BLOCK=triton.next_power_of_2(num_bias), PENALIZE=int(penalize), NB=2 * plan.num_buckets,
        P=plan.num_chunks,
        ZERO=triton.next_power_of_2(triton.cdiv(2 * plan.num_buckets, plan.num_chunks)), K=max_top_logprobs,
        CHUNK=plan.chunk, BLOCK=plan.block, RACE=plan.race, REJECT=plan.reject > 0, TOP_K=plan.reject_top_k,
        KEY_BYTES=KEY_BYTES, FLOOR=plan.topk_floor, POOL=plan.reject_pool_rounds, num_warps=4, **plan.pdl,
        **_NO_FUSION,
    )
