"""A rejection round's pass over its chunk of a row (sampling_reject): race_above, also the penalties kernel's first
race (sampling_reject.first_race), with its block race.

Session 40 built, and session 41 timed and removed, a variant whose first round also listed the tokens above its
candidate so that the later rounds raced that list instead of streaming the row: on an H100 (perf.md) the listing
cost more than the later rounds it shortened (top_p at 32 rows 84.3 -> 97.9 us with two rounds, min_p 66.2 -> 83.5).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_bucket import top_p_weight
from blink.kernels.sampling_noise import race_score
from blink.kernels.sampling_select import canonical

# The race's noise -log(-log u) is below 16.64 for every 23-bit u (sampling_rng: u <= 1 - 2^-24): a token whose
# scaled logit is more than this below a lane's best cannot take that lane
NOISE_BOUND = tl.constexpr(17.0)


@triton.jit
def race_block(hash_of_row, offs, inside, scaled, best, best_token, KEY_BYTES: tl.constexpr):
    """One block's tokens `inside` into the lanes' race (a lane keeps its first maximum: the lowest id)."""
    score = race_score(scaled, inside, hash_of_row, offs, KEY_BYTES)
    take = score > best
    return tl.where(take, score, best), tl.where(take, offs, best_token)


@triton.jit
def race_above(src, chunk, floor, inv_temperature, s_max, cutoff, hash_of_row, weigh, total_weight, approx,
               vocab_size: tl.constexpr, KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
               SPARSE: tl.constexpr, RACE: tl.constexpr = True):
    """This chunk's tokens above `floor` that min_p keeps: the race's best score and its lowest id (vocab_size if
    none is finite), their count and (weigh) their top_p weight; total_weight: also the weight of every token min_p
    keeps; approx: also the float sum of exp(s - s_max) over them (s_max: here the chunk's largest scaled logit).
    A block whose tokens all lie more than the noise's bound below their lanes' best skips the race's hash and logs
    (a real model's row: most of its vocabulary). SPARSE (a round: its floor leaves few tokens above it): a block
    without such a token skips the weights and the race on one test (block-wide reductions cost about as much as
    the block's read). RACE=False (a round that only tests): no race and no weights above; the count, the float
    mass and (total_weight) the total alone."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_token = tl.full([BLOCK], vocab_size, tl.int32)
    count = tl.zeros([BLOCK], tl.int32)
    weight = tl.zeros([BLOCK], tl.int64)
    total = tl.zeros([BLOCK], tl.int64)
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        valid = offs < vocab_size
        x = canonical(tl.load(src + offs, mask=valid, other=float("-inf")))
        scaled = x * inv_temperature
        kept = valid & (scaled >= cutoff)
        inside = kept & (x > floor)
        count += inside.to(tl.int32)
        if approx:  # the first race's: an exp a token, no float-to-int64 conversion nor int64 adds
            mass += tl.where(inside & (scaled > float("-inf")), tl.exp(scaled - s_max), 0.0)
        if weigh & total_weight:  # block-uniform branches; inside is part of kept: one exp for both sums
            if tl.max(kept.to(tl.int32), 0) > 0:
                w = tl.where(kept, top_p_weight(x, inv_temperature, s_max), 0)
                total += w
                weight += tl.where(inside, w, 0)
        if RACE:
            near = inside & (scaled + NOISE_BOUND >= best)
            if SPARSE:
                if tl.max(inside.to(tl.int32), 0) > 0:
                    if weigh & ~total_weight:
                        weight += tl.where(inside, top_p_weight(x, inv_temperature, s_max), 0)
                    if tl.max(near.to(tl.int32), 0) > 0:
                        best, best_token = race_block(hash_of_row, offs, inside, scaled, best, best_token, KEY_BYTES)
            elif tl.max(near.to(tl.int32), 0) > 0:
                best, best_token = race_block(hash_of_row, offs, inside, scaled, best, best_token, KEY_BYTES)
    top = tl.max(best, 0)
    return (top, tl.min(tl.where(best == top, best_token, vocab_size), 0), tl.sum(count, 0), tl.sum(weight, 0),
            tl.sum(total, 0), tl.sum(mass, 0))

