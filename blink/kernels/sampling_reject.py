"""Rejection before the threshold search (issue 17; BLINK_SAMPLER_REJECT=R rounds, sampling_grid.reject_setting).

The choice is the race's winner over the kept set K (sampling_ref). The winner w of the race over any superset of
K is also K's winner when w is in K (the same scores; ties go to the lower id in both), so K itself is needed only
for a yes or no about w: w is kept iff fewer than top_k tokens lie strictly above it and they weigh less than
top_p of the row's total (sampling_ref's definitions, at the first token of w's run of ties). If w is not kept,
every kept token lies strictly above it, so the race over {x > x_w} is the next, smaller superset. Like FlashInfer's
sorting-free samplers it replaces the sort (here: the bucket search) by passes that test a pivot; unlike them it
keeps the seeded race, so a request draws the same token as with the search, token for token.
  1. _reject_first_kernel: each program races its chunk over the tokens min_p keeps and sums their top_p weights;
     the row's last program (a ticket) merges the candidate and the total.
  2. _reject_round_kernel, launched R times: a pending row's programs count and weigh the tokens above the
     candidate and race them; the last program accepts the candidate (DECIDED) or takes the next one.
A decided row skips the bucket search (row_params), the resolve gives it its token's value as threshold and the
token as its race list, so the choose kernel's list race returns it. Rows still pending after R rounds, and the rows
this does not take (no filter, greedy, top_k with top_p: top_p's total is over the top_k set; top_k alone unless
asked for, sampling_grid.reject_setting; no finite maximum), run the search as before. A top_p = p row accepts
each candidate with probability >= p (it is drawn from a superset's mass), so one round decides most top_p rows; a
top_k row accepts with the top_k set's share of the mass, which is small on flat rows. A pending row costs the
whole search: its programs stream their chunks as at full batch. Needs the list race (RACE > 0): the penalties
kernel writes the rows' log-sum-exp.
Scratch: state [S, REJECT_WORDS] i64 (sampling_plan), per chunk best f32, token i32, count i32, weight i64.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.pdl import pdl_wait
from blink.kernels.sampling_bucket import _row_scale, _row_top, row_params, top_p_weight
from blink.kernels.sampling_plan import COUNTERS, DECIDED, PENDING, REJECT_TICKET, REJECT_WORDS, SEARCH
from blink.kernels.sampling_rng import KEY_BYTES, race_uniform, row_hash
from blink.kernels.sampling_select import canonical

_NO_FUSION = {"enable_fp_fusion": False}


# The race's noise -log(-log u) is below 16.64 for every 23-bit u (sampling_rng: u <= 1 - 2^-24): a token whose
# scaled logit is more than this below a lane's best cannot take that lane
_NOISE_BOUND = tl.constexpr(17.0)


@triton.jit
def _race_above(src, chunk, floor, inv_temperature, s_max, cutoff, hash_of_row, weigh, vocab_size: tl.constexpr,
                KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """This chunk's tokens above `floor` that min_p keeps: the race's best score and its lowest id (vocab_size if
    none is finite), their count and (weigh) their top_p weight. A block without such a token skips the weights
    and the race (a round's floor leaves few tokens above it), and one whose tokens all lie more than the noise's
    bound below their lanes' best skips the race's hash and logs (a real model's row: most of its vocabulary)."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)  # a lane keeps its first maximum: the lowest id
    best_token = tl.full([BLOCK], vocab_size, tl.int32)
    count = tl.zeros([BLOCK], tl.int32)
    weight = tl.zeros([BLOCK], tl.int64)
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        valid = offs < vocab_size
        x = canonical(tl.load(src + offs, mask=valid, other=float("-inf")))
        scaled = x * inv_temperature
        inside = valid & (x > floor) & (scaled >= cutoff)
        count += inside.to(tl.int32)
        if tl.max(inside.to(tl.int32), 0) > 0:  # block-uniform branches
            if weigh:
                weight += tl.where(inside, top_p_weight(x, inv_temperature, s_max), 0)
            if tl.max((inside & (scaled + _NOISE_BOUND >= best)).to(tl.int32), 0) > 0:
                u = race_uniform(hash_of_row, offs, KEY_BYTES)
                score = tl.where(inside, scaled - tl.log(-tl.log(u)), float("-inf"))
                take = score > best
                best = tl.where(take, score, best)
                best_token = tl.where(take, offs, best_token)
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_token, vocab_size), 0), tl.sum(count, 0), tl.sum(weight, 0)


@triton.jit
def _last_of_row(counter_ptr, row, launches):
    """After this program's partial stores: whether it is the row's last program in this launch. The ticket counts
    on across launches (the penalties kernel zeroes it), so the last one of launch n sees (n + 1) * P - 1."""
    tl.debug_barrier()  # every thread's stores come before the release below
    return tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_TICKET, 1, sem="acq_rel", scope="gpu") == launches - 1


@triton.jit
def _merge(part_best_ptr, part_token_ptr, row, vocab_size: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """The row's race winner over its chunks' partials (vocab_size if none)."""
    c = tl.arange(0, P_PAD)
    best = tl.load(part_best_ptr + row * P + c, mask=c < P, other=float("-inf"))
    token = tl.load(part_token_ptr + row * P + c, mask=c < P, other=vocab_size)
    return tl.min(tl.where(best == tl.max(best, 0), token, vocab_size), 0)


@triton.jit
def _reject_first_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                         min_p_ptr, seed_ptr, positions_ptr, key_max_ptr, counter_ptr, part_best_ptr, part_token_ptr,
                         part_weight_ptr, reject_ptr, vocab_size: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr,
                         KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, TOP_K: tl.constexpr,
                         USE_PDL: tl.constexpr = False):
    """TOP_K: take top_k-only rows too (else rows with top_p or min_p and no top_k)."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    filtered, processed, temperature, top_k, top_p, min_p = row_params(
        row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, False)
    top, finite = _row_top(key_max_ptr, row, P, P_PAD)
    state = reject_ptr + row * REJECT_WORDS
    if filtered & finite & ((top_k <= 0) | (TOP_K & (top_p >= 1.0))):
        src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed, temperature,
                                                         min_p, top, vocab_size)
        hash_of_row = row_hash(tl.load(seed_ptr + tl.maximum(tl.load(slots_ptr + row), 0)),
                               tl.load(positions_ptr + row))
        best, token, _, weight = _race_above(src, chunk, float("-inf"), inv_temperature, s_max, cutoff, hash_of_row,
                                             top_p < 1.0, vocab_size, KEY_BYTES, CHUNK, BLOCK)
        tl.store(part_best_ptr + row * P + chunk, best)
        tl.store(part_token_ptr + row * P + chunk, token)
        tl.store(part_weight_ptr + row * P + chunk, weight)
        if _last_of_row(counter_ptr, row, P):
            c = tl.arange(0, P_PAD)
            total = tl.sum(tl.load(part_weight_ptr + row * P + c, mask=c < P, other=0), 0)
            candidate = _merge(part_best_ptr, part_token_ptr, row, vocab_size, P, P_PAD)
            tl.store(state, tl.where(candidate < vocab_size, PENDING, SEARCH).to(tl.int64))
            tl.store(state + 1, candidate.to(tl.int64))
            tl.store(state + 2, total)
    elif chunk == 0:
        tl.store(state, tl.full([], SEARCH, tl.int64))


@triton.jit
def _reject_round_kernel(logits_ptr, processed_ptr, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                         min_p_ptr, seed_ptr, positions_ptr, key_max_ptr, counter_ptr, part_best_ptr, part_token_ptr,
                         part_weight_ptr, part_count_ptr, reject_ptr, race_ids_ptr, launch, vocab_size: tl.constexpr,
                         P: tl.constexpr, P_PAD: tl.constexpr, KEY_BYTES: tl.constexpr, RACE: tl.constexpr,
                         CHUNK: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    """launch: 1 for the first round, 2 for the second, ... (the ticket's count goes on from the first kernel)."""
    pdl_wait(USE_PDL)  # first: every program, before any early exit (kernels/pdl.py)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    state = reject_ptr + row * REJECT_WORDS
    if tl.load(state) == PENDING:
        _, processed, temperature, top_k, top_p, min_p = row_params(
            row, slots_ptr, flags_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, reject_ptr, False)
        top, _ = _row_top(key_max_ptr, row, P, P_PAD)
        src, inv_temperature, s_max, cutoff = _row_scale(logits_ptr, processed_ptr, row, processed, temperature,
                                                         min_p, top, vocab_size)
        candidate = tl.load(state + 1).to(tl.int32)
        hash_of_row = row_hash(tl.load(seed_ptr + tl.maximum(tl.load(slots_ptr + row), 0)),
                               tl.load(positions_ptr + row))
        best, token, count, weight = _race_above(src, chunk, canonical(tl.load(src + candidate)), inv_temperature,
                                                 s_max, cutoff, hash_of_row, top_p < 1.0, vocab_size, KEY_BYTES,
                                                 CHUNK, BLOCK)
        tl.store(part_best_ptr + row * P + chunk, best)
        tl.store(part_token_ptr + row * P + chunk, token)
        tl.store(part_weight_ptr + row * P + chunk, weight)
        tl.store(part_count_ptr + row * P + chunk, count)
        if _last_of_row(counter_ptr, row, (launch + 1) * P):
            c = tl.arange(0, P_PAD)
            above = tl.sum(tl.load(part_count_ptr + row * P + c, mask=c < P, other=0), 0)
            mass_above = tl.sum(tl.load(part_weight_ptr + row * P + c, mask=c < P, other=0), 0)
            budget = top_p.to(tl.float64) * tl.load(state + 2).to(tl.float64)  # sampling_ref's, in float64
            kept = ((top_k <= 0) | (above < top_k)) & ((top_p >= 1.0) | (mass_above.to(tl.float64) < budget))
            following = _merge(part_best_ptr, part_token_ptr, row, vocab_size, P, P_PAD)
            if kept:
                tl.store(race_ids_ptr + row * RACE, candidate)
                tl.store(state, tl.full([], DECIDED, tl.int64))
            elif following < vocab_size:
                tl.store(state + 1, following.to(tl.int64))
            else:  # not reached: a candidate with nothing above it is kept, unless top_p is 0
                tl.store(state, tl.full([], SEARCH, tl.int64))


def reject(logits, processed, slots, positions, state, plan) -> None:
    """Steps 1-2 for plan.reject rounds (sampling_grid._Plan; it needs the list race and the penalties kernel's
    chunk maxima and zeroed counters)."""
    num_rows, vocab_size = logits.shape
    assert plan.reject > 0 and plan.race > 0, "the rejection needs rounds and the list race"
    args = (logits, processed, slots, state.flags, state.temperature, state.top_k, state.top_p, state.min_p,
            state.seed, positions, plan.row_max, plan.counters, plan.reject_best, plan.reject_token,
            plan.reject_weight)
    sizes = dict(P=plan.num_chunks, P_PAD=plan.chunks_pad, KEY_BYTES=KEY_BYTES, CHUNK=plan.chunk, BLOCK=plan.block,
                 num_warps=4, **plan.pdl, **_NO_FUSION)
    _reject_first_kernel[plan.grid](*args, plan.reject_state, vocab_size, TOP_K=plan.reject_top_k, **sizes)
    for launch in range(1, plan.reject + 1):
        _reject_round_kernel[plan.grid](*args, plan.reject_count, plan.reject_state, plan.race_ids, launch,
                                        vocab_size, RACE=plan.race, **sizes)
