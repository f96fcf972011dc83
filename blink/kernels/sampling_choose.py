"""Steps 6 and 7 of the sampler (sampling.py): the choice and the raw log-sum-exp per chunk, then one program per
row that merges the chunks into the token, its logprob and the top-K logprobs (and, recording, what follows the
choice: sampling_record)."""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_noise import race_score
from blink.kernels.sampling_plan import COUNTERS
from blink.kernels.sampling_race import lse_step, race_over_list, store_lse
from blink.kernels.sampling_record import record_token
from blink.kernels.sampling_rng import row_hash
from blink.kernels.sampling_topk import asks_for_logprobs, top_floor, write_top_from_candidates

_INT32_MAX = tl.constexpr(0x7FFFFFFF)


# ---- 6. choice and log-sum-exp, per chunk ---------------------------------------------------------
@triton.jit
def _choose_kernel(logits_ptr, processed_ptr, threshold_ptr, slots_ptr, positions_ptr, flags_ptr, temperature_ptr,
                   seed_ptr, part_max_ptr, part_sum_ptr, part_best_ptr, part_token_ptr, part_largest_ptr,
                   race_count_ptr, race_ids_ptr, vocab_size: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                   KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, RACE: tl.constexpr = 0,
                   RACE_BLOCK: tl.constexpr = 16, SEARCHED: tl.constexpr = True, USE_PDL: tl.constexpr = False):
    """RACE > 0: rows the resolve marked race over their list only (sampling_race); the penalties kernel wrote
    their log-sum-exp partials. SEARCHED=False: no search ran (sample_triton's `search`), so every row takes what
    the resolve writes for a row without a filter: threshold -inf, no list."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    noisy = (temperature != 0.0) & (slot >= 0)
    processed = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0) != 0
    inv_temperature = tl.math.div_rn(1.0, tl.where(noisy, temperature, 1.0))  # rounded as torch's '/'
    threshold = tl.full([], float("-inf"), tl.float32)
    if SEARCHED:
        threshold = tl.load(threshold_ptr + row)
    hash_of_row = row_hash(tl.load(seed_ptr + safe_slot), tl.load(positions_ptr + row))
    raw_row = logits_ptr + row.to(tl.int64) * vocab_size
    processed_row = processed_ptr + row.to(tl.int64) * vocab_size
    out = row * NUM_CHUNKS + chunk

    listed = tl.full([], -1, tl.int32)
    if SEARCHED and RACE > 0:
        listed = tl.load(race_count_ptr + row)
    if listed >= 0:
        score_row = raw_row
        if processed:
            score_row = processed_row
        top, token = race_over_list(race_ids_ptr + row * RACE, listed, score_row, threshold, inv_temperature,
                                    hash_of_row, chunk, vocab_size, NUM_CHUNKS, KEY_BYTES, RACE, RACE_BLOCK)
        tl.store(part_best_ptr + out, top)
        tl.store(part_token_ptr + out, token)
    else:
        run_max = tl.full([BLOCK], float("-inf"), tl.float32)  # online log-sum-exp of the raw logits, per lane
        run_sum = tl.zeros([BLOCK], tl.float32)
        largest = tl.full([BLOCK], -_INT32_MAX - 1, tl.int32)  # of the raw row, for the top-K fallback search
        best = tl.full([BLOCK], float("-inf"), tl.float32)  # a lane keeps its first maximum
        best_token = tl.full([BLOCK], vocab_size, tl.int32)
        for start in range(0, CHUNK, BLOCK):
            offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
            valid = offs < vocab_size
            x = tl.load(raw_row + offs, mask=valid, other=float("-inf"))
            run_max, run_sum, largest = lse_step(run_max, run_sum, largest, x, valid)

            score = x
            if processed:
                score = tl.load(processed_row + offs, mask=valid, other=float("-inf"))
            if noisy:
                score = race_score(score * inv_temperature, score >= threshold, hash_of_row, offs, KEY_BYTES)
            take = score > best
            best = tl.where(take, score, best)
            best_token = tl.where(take, offs, best_token)

        store_lse(part_max_ptr, part_sum_ptr, part_largest_ptr, out, run_max, run_sum, largest)
        top = tl.max(best, 0)
        tl.store(part_best_ptr + out, top)
        tl.store(part_token_ptr + out, tl.min(tl.where(best == top, best_token, vocab_size), 0))


# ---- 7. merge the chunks; logprobs ----------------------------------------------------------------
@triton.jit
def _finish_kernel(logits_ptr, scratch_ptr, slots_ptr, num_logprobs_ptr, part_max_ptr, part_sum_ptr,
                   part_best_ptr, part_token_ptr, part_smallest_ptr, part_largest_ptr, top_keys_ptr, counter_ptr,
                   cand_key_ptr, cand_id_ptr, token_ptr, logprob_ptr, top_ids_ptr, top_logprobs_ptr, flags_ptr,
                   counts_ptr, gstate_ptr, gid_ptr, classes_ptr, row_base_ptr, cells_ptr,
                   vocab_size: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr, K: tl.constexpr,
                   K_PAD: tl.constexpr, CAND: tl.constexpr, SMALL: tl.constexpr, BLOCK: tl.constexpr,
                   RECORD: tl.constexpr = False, GRAMMAR: tl.constexpr = False, USE_PDL: tl.constexpr = False):
    """RECORD: also what followed the choice in launches of their own (sampling_record's count of the token in its
    slot's penalty history; with GRAMMAR, sampling_grammar's advance of a constrained slot's DFA state)."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
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
    if RECORD:
        record_token(row, token, slots_ptr, flags_ptr, counts_ptr, gstate_ptr, gid_ptr, classes_ptr, row_base_ptr,
                     cells_ptr, vocab_size, GRAMMAR)

    if K > 0:
        ids_out = top_ids_ptr + row.to(tl.int64) * K
        logprobs_out = top_logprobs_ptr + row.to(tl.int64) * K
        if asks_for_logprobs(row, slots_ptr, num_logprobs_ptr):
            largest = tl.max(tl.load(part_largest_ptr + part, mask=in_range, other=-_INT32_MAX - 1), 0)
            write_top_from_candidates(
                raw_row, scratch_ptr + row.to(tl.int64) * vocab_size, cand_key_ptr + row * CAND,
                cand_id_ptr + row * CAND, tl.load(counter_ptr + row * COUNTERS + 1),
                top_floor(top_keys_ptr, part_smallest_ptr, row, K, NUM_CHUNKS, CHUNKS_PAD), largest, normalizer,
                ids_out, logprobs_out, vocab_size, K, K_PAD, CAND, SMALL, BLOCK)
        else:
            k = tl.arange(0, K_PAD)
            tl.store(ids_out + k, tl.full([K_PAD], -1, tl.int64), mask=k < K)
            tl.store(logprobs_out + k, tl.full([K_PAD], float("-inf"), tl.float32), mask=k < K)
