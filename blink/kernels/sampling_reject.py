"""Rejection before the threshold search (issue 17; BLINK_SAMPLER_REJECT=R rounds, sampling_grid.reject_setting).

The choice is the race's winner over the kept set K (sampling_ref). The winner w of the race over any superset of
K is also K's winner when w is in K (the same scores; ties go to the lower id in both), so K itself is needed only
for a yes or no about w: w is kept iff min_p keeps it, fewer than top_k tokens lie strictly above it and they weigh
less than top_p of the row's total (sampling_ref's definitions, at the first token of w's run of ties). If w is not
kept, every kept token lies strictly above it, so the race over {x > x_w} is the next, smaller superset. Like
FlashInfer's sorting-free samplers it replaces the sort (here: the bucket search) by passes that test a pivot;
unlike them it keeps the seeded race, so a request draws the same token as with the search, token for token.
  0. first_race, inside the penalties kernel (sampling_penalties), which reads the row anyway: each program races
     its chunk over the tokens min_p would keep if the chunk's maximum were the row's (a superset: the row's
     maximum is no smaller), so no launch of its own and no pass of its own (session 28 measured the separate
     first pass at 4 us on greedy rows, which launched it for nothing).
  1. R rounds of _reject_round_kernel (on the GPU in one launch, sampling_reject_sync; "Rs" and the interpreter:
     a launch a round): a pending row's programs count and weigh the tokens above the candidate and race them; the
     row's last program (a ticket) accepts the candidate (DECIDED) or takes the next one. top_p's total needs the
     row's maximum, which only the penalties kernel's end knows: for a row without min_p (whose set is every token)
     the first race also sums each chunk's float mass relative to the chunk's maximum, and the first round rescales
     those into integer bounds lo <= total <= hi (row_total_bounds); a candidate whose mass above lies between
     top_p * lo and top_p * hi (rare: the bounds are ~2^-12 apart) goes to the search. Under min_p the first
     round weighs the row's min_p set exactly (lo = hi).
A decided row skips the bucket search (row_params), the resolve gives it its token's value as threshold and the
token as its race list, so the choose kernel's list race returns it. Rows still pending after R rounds, and the rows
this does not take (no filter, greedy, top_k with top_p: top_p's total is over the top_k set; top_k alone unless
asked for, sampling_grid.reject_setting; no finite maximum), run the search as before. A top_p = p row accepts
each candidate drawn from min_p's set with probability >= p; the first candidate comes from a larger set, so a
min_p row may spend its first round on a token below the cutoff. A round that rejects its candidate w also bounds the
next one, w' (the winner above w): fewer tokens lie above w' than above w, and they weigh at most w's mass above less
w' itself, so when those bounds pass w' is decided in the same round (a min_p-alone row always; a top_p row when w'
carries enough of the mass, as a real model's few likely tokens do). A top_k row accepts with the top_k set's share of
the mass, which is small on flat rows. A pending row costs the whole search: its programs stream their chunks as at
full batch. Needs the list race (RACE > 0): the penalties kernel writes the rows' log-sum-exp.
Scratch: state [S, REJECT_WORDS] i64 (sampling_plan); per chunk: the first race's best f32, token i32 and mass
f32, a round's best f32, token i32, count i32, weight above and total weight i64.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_bucket import _row_scale, _row_top, row_params, scale_cutoff
from blink.kernels.sampling_plan import DECIDED, PENDING, REJECT_WORDS, SEARCH
from blink.kernels.sampling_reject_bounds import BOUND_SLACK, mass_bounds, row_total_bounds
from blink.kernels.sampling_reject_decide import decide, keeps
from blink.kernels.sampling_reject_pass import race_above
from blink.kernels.sampling_reject_pool import hand_on, may_join, pool_rounds, row_done
from blink.kernels.sampling_reject_sync import (
    last_of_row,
    merge_race,
    program_cell,
    release_round,
    sum_parts,
    wait_round,
)
from blink.kernels.sampling_rng import KEY_BYTES, row_hash
from blink.kernels.sampling_select import canonical

_NO_FUSION = {"enable_fp_fusion": False}
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # its programs run one after another: no waits


@triton.jit
def taken(filtered, top_k, top_p, TOP_K: tl.constexpr):
    """Whether the rejection takes a row (TOP_K: top_k-only rows too; top_k with top_p never)."""
    return filtered & ((top_k <= 0) | (TOP_K & (top_p >= 1.0)))


@triton.jit
def first_race(src, chunk, chunk_key_max, temperature, top_p, min_p, seed, position, best_ptr, token_ptr, mass_ptr,
               vocab_size: tl.constexpr, KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Step 0 for one program of a taken row (the penalties kernel calls it after its chunk maximum): the race over
    this chunk's tokens at or above min_p's cutoff from the chunk's own maximum, into best_ptr / token_ptr; for a
    top_p row without min_p (whose set is then every token), the chunk's float mass relative to its own largest
    scaled logit, into mass_ptr (row_total_bounds)."""
    inv_temperature, s_chunk, cutoff = scale_cutoff(temperature, min_p, chunk_key_max)
    best, token, _, _, _, mass = race_above(src, chunk, float("-inf"), inv_temperature, s_chunk, cutoff,
                                            row_hash(seed, position), False, False, (top_p < 1.0) & (min_p <= 0.0),
                                            vocab_size, KEY_BYTES, CHUNK, BLOCK, False)
    tl.store(best_ptr, best)
    tl.store(token_ptr, token)
    tl.store(mass_ptr, mass)


@triton.jit
def _round(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
           seed_ptr, positions_ptr, key_max_ptr, counter_ptr, first_best_ptr, first_token_ptr, first_mass_ptr,
           part_best_ptr, part_token_ptr, part_weight_ptr, part_total_ptr, part_count_ptr, reject_ptr, race_ids_ptr,
           pool_ptr, words_ptr, num_rows, row, chunk, launch, vocab_size: tl.constexpr, P: tl.constexpr,
           P_PAD: tl.constexpr, KEY_BYTES: tl.constexpr, RACE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
           FIRST: tl.constexpr, TOP_K: tl.constexpr, SLACK: tl.constexpr, TEST_FIRST: tl.constexpr,
           POOL_ROUNDS: tl.constexpr):
    """Round `launch` (1, 2, ...; FIRST: it takes the rows and the penalties kernel's candidate) for one program of
    a row; whether the row took part (pending at its start). TEST_FIRST: the first round only tests its candidate,
    in float (sampling_reject_bounds.mass_bounds): a refused or undecided candidate stays pending, and the next
    round tests it exactly and races above it. The last program of the row decides and releases the round, or
    (POOL_ROUNDS: the plan's rounds, the first being this one) hands the row on to the pool's rounds."""
    TESTS_ONLY: tl.constexpr = FIRST and TEST_FIRST
    state = reject_ptr + row * REJECT_WORDS
    if FIRST:
        filtered, processed, temperature, top_k, top_p, min_p = row_params(
            row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, False)
        top, finite = _row_top(key_max_ptr, row, P, P_PAD)
        candidate = merge_race(first_best_ptr, first_token_ptr, row, vocab_size, P, P_PAD)
        pending = taken(filtered, top_k, top_p, TOP_K) & finite & (candidate < vocab_size)
        if ~pending & (chunk == 0):
            tl.store(state, tl.full([], SEARCH, tl.int64))
            if POOL_ROUNDS > 0:
                row_done(words_ptr, num_rows, POOL_ROUNDS)
    else:
        pending = tl.load(state, cache_modifier=".cg") == PENDING
        candidate = tl.load(state + 1, cache_modifier=".cg").to(tl.int32)
    if pending:
        if not FIRST:  # a row no round takes (greedy, say) reads its state word alone
            _, processed, temperature, top_k, top_p, min_p = row_params(
                row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, False)
            top, _ = _row_top(key_max_ptr, row, P, P_PAD)
        src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed, temperature,
                                                         min_p, top, vocab_size)
        hash_of_row = row_hash(tl.load(seed_ptr + tl.maximum(tl.load(slots_ptr + row), 0)),
                               tl.load(positions_ptr + row))
        value = canonical(tl.load(src + candidate))
        # the first round weighs the row's whole set only under min_p (else the first race's masses bound it)
        exact_total = FIRST & (top_p < 1.0) & (min_p > 0.0)
        part = row * P + chunk
        if TESTS_ONLY:  # the count and float mass above (under min_p also the exact total), no race: the float
            # sums of the same f32 exps top_p_weight floors (sampling_reject_bounds), into the race's partials
            _, _, count, _, total, mass = race_above(src, chunk, value, inv_temperature, s_max, cutoff, hash_of_row,
                                                     exact_total, exact_total, True, vocab_size, KEY_BYTES, CHUNK,
                                                     BLOCK, False, RACE=False)
            tl.store(part_best_ptr + part, mass)
        else:
            best, token, count, weight, total, _ = race_above(
                src, chunk, value, inv_temperature, s_max, cutoff, hash_of_row, top_p < 1.0, exact_total, False,
                vocab_size, KEY_BYTES, CHUNK, BLOCK, True)
            tl.store(part_best_ptr + part, best)
            tl.store(part_token_ptr + part, token)
            tl.store(part_weight_ptr + part, weight)
        tl.store(part_count_ptr + part, count)
        if FIRST:
            tl.store(part_total_ptr + part, total)
        if last_of_row(counter_ptr, row, launch * P):
            above = sum_parts(part_count_ptr, row, P, P_PAD)
            if TESTS_ONLY:
                mass_lo, mass_hi = mass_bounds(part_best_ptr, row, above, P, P_PAD, SLACK)
            else:
                mass_lo = sum_parts(part_weight_ptr, row, P, P_PAD).to(tl.float64)
                mass_hi = mass_lo
            if FIRST:
                if exact_total:
                    total_lo = sum_parts(part_total_ptr, row, P, P_PAD)
                    total_hi = total_lo
                else:
                    total_lo, total_hi = row_total_bounds(first_mass_ptr, key_max_ptr, row, inv_temperature, s_max,
                                                          vocab_size, P, P_PAD, SLACK)
                tl.store(state + 2, total_lo)
                tl.store(state + 3, total_hi)
            else:
                total_lo = tl.load(state + 2, cache_modifier=".cg")
                total_hi = tl.load(state + 3, cache_modifier=".cg")
            if TESTS_ONLY:  # keep the candidate, or leave it pending: the next round tests it exactly, and races
                # above it (decide's test, without its refusal)
                kept, _by_counts = keeps(value, inv_temperature, cutoff, top_k, top_p, above, mass_hi, total_lo)
                if kept:
                    tl.store(race_ids_ptr + row * RACE, candidate)
                    tl.store(state, tl.full([], DECIDED, tl.int64))
                else:
                    tl.store(state, tl.full([], PENDING, tl.int64))
                tl.store(state + 1, candidate.to(tl.int64))
                still = ~kept
                following = candidate  # the next round tests it again
            else:
                following = merge_race(part_best_ptr, part_token_ptr, row, vocab_size, P, P_PAD)
                still = decide(state, race_ids_ptr, row, src, candidate, value, inv_temperature, s_max, cutoff, top_k,
                               top_p, above, mass_lo, mass_hi, total_lo, total_hi, following, vocab_size, RACE)
            if POOL_ROUNDS > 0:  # the pool's rounds follow: queue the row, or count it done
                hand_on(words_ptr, pool_ptr, row, 2, still, num_rows, src, processed, following, inv_temperature,
                        s_max, cutoff, top_k, top_p, hash_of_row, POOL_ROUNDS)
            else:
                release_round(counter_ptr, row)
    return pending


@triton.jit
def _reject_round_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                         min_p_ptr, seed_ptr, positions_ptr, key_max_ptr, counter_ptr, first_best_ptr,
                         first_token_ptr, first_mass_ptr, part_best_ptr, part_token_ptr, part_weight_ptr,
                         part_total_ptr, part_count_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr, num_rows,
                         launch,
                         vocab_size: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr, KEY_BYTES: tl.constexpr,
                         RACE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FIRST: tl.constexpr,
                         TOP_K: tl.constexpr, SLACK: tl.constexpr, TEST_FIRST: tl.constexpr = False,
                         ROUNDS: tl.constexpr = 1, POOL_ROUNDS: tl.constexpr = 0, IN_ORDER: tl.constexpr = False,
                         U: tl.constexpr = 1, UNIT: tl.constexpr = 16, UNIT_BLOCK: tl.constexpr = 16,
                         HELPERS: tl.constexpr = 0, USE_PDL: tl.constexpr = False):
    """Rounds launch .. launch + ROUNDS - 1 (ROUNDS > 1: the rounds in one launch over a one-dimensional grid,
    sampling_reject_sync; FIRST: launch is 1). POOL_ROUNDS > 0: the first round, then (IN_ORDER: in one launch,
    with HELPERS more programs that run no first round) the pool's rounds up to POOL_ROUNDS (sampling_reject_pool)."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row, chunk = program_cell(counter_ptr, P, ROUNDS > 1 or IN_ORDER)
    args = (logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
            seed_ptr, positions_ptr, key_max_ptr, counter_ptr, first_best_ptr, first_token_ptr, first_mass_ptr,
            part_best_ptr, part_token_ptr, part_weight_ptr, part_total_ptr, part_count_ptr, reject_ptr,
            race_ids_ptr, pool_ptr, words_ptr, num_rows, row, chunk)
    if IN_ORDER and POOL_ROUNDS > 0:  # the cells past the rows' are the pool's helpers: they start last
        if row < num_rows:
            _round(*args, launch, vocab_size, P, P_PAD, KEY_BYTES, RACE, CHUNK, BLOCK, FIRST, TOP_K, SLACK,
                   TEST_FIRST, POOL_ROUNDS)
        if POOL_ROUNDS > 1:
            if may_join(counter_ptr, row, num_rows, P, HELPERS):
                pool_rounds(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr,
                            num_rows, vocab_size, P, KEY_BYTES, RACE, U, UNIT, UNIT_BLOCK, POOL_ROUNDS, True)
    else:
        active = _round(*args, launch, vocab_size, P, P_PAD, KEY_BYTES, RACE, CHUNK, BLOCK, FIRST, TOP_K, SLACK,
                        TEST_FIRST, POOL_ROUNDS)
        for n in range(launch + 1, launch + ROUNDS):  # a row every round took part in waits for the last one's word
            if active:
                wait_round(counter_ptr, row, n - 1)
                active = _round(*args, n, vocab_size, P, P_PAD, KEY_BYTES, RACE, CHUNK, BLOCK, False, TOP_K, SLACK,
                                False, 0)


@triton.jit
def _reject_pool_kernel(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr,
                        num_rows, vocab_size: tl.constexpr, P: tl.constexpr, KEY_BYTES: tl.constexpr,
                        RACE: tl.constexpr, U: tl.constexpr, UNIT: tl.constexpr, UNIT_BLOCK: tl.constexpr,
                        ROUNDS: tl.constexpr, WAIT: tl.constexpr, USE_PDL: tl.constexpr = False):
    """The pool's rounds in a launch of their own, after a launch of the first round."""
    pdl_wait(USE_PDL)
    pool_rounds(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr, num_rows,
                vocab_size, P, KEY_BYTES, RACE, U, UNIT, UNIT_BLOCK, ROUNDS, WAIT)


def reject(logits, processed, slots, positions, state, plan) -> None:
    """Step 1 for plan.reject rounds (sampling_grid._Plan; it needs the list race and the penalties kernel's chunk
    maxima, first race and zeroed counters)."""
    num_rows, vocab_size = logits.shape
    assert plan.reject > 0 and plan.race > 0, "the rejection needs rounds and the list race"
    inputs = (logits, processed, slots, state.flags, state.temperature, state.top_k, state.top_p, state.min_p,
              state.seed, positions, plan.row_max, plan.counters)
    args = (*inputs, plan.reject_first_best, plan.reject_first_token, plan.reject_first_mass, plan.reject_best,
            plan.reject_token, plan.reject_weight[0], plan.reject_weight[1], plan.reject_count, plan.reject_state,
            plan.race_ids, plan.reject_pool, plan.pool_words, num_rows)
    sizes = dict(P=plan.num_chunks, KEY_BYTES=KEY_BYTES, RACE=plan.race, num_warps=4, **plan.pdl, **_NO_FUSION)
    first = dict(sizes, P_PAD=plan.chunks_pad, CHUNK=plan.chunk, BLOCK=plan.block, TOP_K=plan.reject_top_k,
                 SLACK=BOUND_SLACK, TEST_FIRST=plan.reject_test_first)
    one_launch = plan.reject > 1 and not plan.reject_separate and logits.is_cuda and not _INTERPRETED
    if plan.reject_pool_rounds:
        units = dict(U=triton.cdiv(vocab_size, plan.pool_unit), UNIT=plan.pool_unit,
                     UNIT_BLOCK=min(plan.pool_unit, plan.block))
        rounds = dict(POOL_ROUNDS=plan.reject, **units)
        if one_launch:  # the first round in order (program_cell), then the pool in the same launch
            _reject_round_kernel[(num_rows * plan.num_chunks + plan.pool_helpers,)](
                *args, 1, vocab_size, FIRST=True, IN_ORDER=True, HELPERS=plan.pool_helpers, maxnreg=128, **rounds,
                **first)
            return
        _reject_round_kernel[plan.grid](*args, 1, vocab_size, FIRST=True, **rounds, **first)
        if plan.reject > 1:  # the interpreter's programs run one after another: two of them, and no waits
            programs = 2 if _INTERPRETED or not logits.is_cuda else num_rows * plan.num_chunks
            _reject_pool_kernel[(programs,)](logits, processed, plan.counters, plan.reject_state, plan.race_ids,
                                             plan.reject_pool, plan.pool_words, num_rows, vocab_size,
                                             ROUNDS=plan.reject, WAIT=not _INTERPRETED and logits.is_cuda, **units,
                                             **sizes)
        return
    if one_launch:
        # one launch: program_cell hands the cells out in a one-dimensional grid. The later rounds' pointers stay
        # live through the first (156 registers at sm_90, 3 programs an SM); 128 spill 20 bytes and fit 4 an SM,
        # so the 512 programs of 32 rows are resident at once
        _reject_round_kernel[(num_rows * plan.num_chunks,)](*args, 1, vocab_size, FIRST=True, ROUNDS=plan.reject,
                                                             maxnreg=128, **first)
        return
    for launch in range(1, plan.reject + 1):
        _reject_round_kernel[plan.grid](*args, launch, vocab_size, FIRST=launch == 1, **first)
