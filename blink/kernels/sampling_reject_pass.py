"""A rejection round's pass over its tokens (sampling_reject): the stream over a chunk (race_above, also the penalties
kernel's first race) and, with the "l" of BLINK_SAMPLER_REJECT (sampling_grid.reject_setting), the first round's
list of the tokens above its candidate, which the later rounds race instead of the row (list_block, race_listed).

A round counts, weighs and races the tokens above its candidate, and a rejected candidate's successor lies above
it, so every later round's set lies inside the first round's. The first round streams every taken row (at 32 rows
its cost is throughput); a later round has only the rows still pending, so its cost is one program's latency over
its chunk. With the list, the first round writes the ids of the tokens it counted into the row's race list (which
the compaction fills only after the rounds, and a decided row's first entry then holds its token), and a later round
reads the list instead of the row. The list is whole when the first round's count fits in LIST ids; a row whose
count does not fit streams its later rounds as before.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_bucket import top_p_weight
from blink.kernels.sampling_noise import race_score, race_take_unordered
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
                list_row, listed_ptr, vocab_size: tl.constexpr, KEY_BYTES: tl.constexpr, CHUNK: tl.constexpr,
                BLOCK: tl.constexpr, SPARSE: tl.constexpr, RACE: tl.constexpr = True, LIST: tl.constexpr = 0):
    """This chunk's tokens above `floor` that min_p keeps: the race's best score and its lowest id (vocab_size if
    none is finite), their count and (weigh) their top_p weight; total_weight: also the weight of every token min_p
    keeps; approx: also the float sum of exp(s - s_max) over them (s_max: here the chunk's largest scaled logit).
    A block whose tokens all lie more than the noise's bound below their lanes' best skips the race's hash and logs
    (a real model's row: most of its vocabulary). SPARSE (a round: its floor leaves few tokens above it): a block
    without such a token skips the weights and the race on one test (block-wide reductions cost about as much as
    the block's read). RACE=False (a round that only tests): no race and no weights above; the count, the float
    mass and (total_weight) the total alone. LIST (a SPARSE first round): also the ids of the tokens above `floor`
    into list_row, counted at listed_ptr (list_block, below)."""
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
                    if LIST > 0:
                        list_block(list_row, listed_ptr, offs, inside, LIST)
                    if weigh & ~total_weight:
                        weight += tl.where(inside, top_p_weight(x, inv_temperature, s_max), 0)
                    if tl.max(near.to(tl.int32), 0) > 0:
                        best, best_token = race_block(hash_of_row, offs, inside, scaled, best, best_token, KEY_BYTES)
            elif tl.max(near.to(tl.int32), 0) > 0:
                best, best_token = race_block(hash_of_row, offs, inside, scaled, best, best_token, KEY_BYTES)
    top = tl.max(best, 0)
    return (top, tl.min(tl.where(best == top, best_token, vocab_size), 0), tl.sum(count, 0), tl.sum(weight, 0),
            tl.sum(total, 0), tl.sum(mass, 0))


@triton.jit
def list_block(list_row, listed_ptr, offs, inside, LIST: tl.constexpr):
    """Append a block's tokens `inside` to the row's list: the block's share reserved with one atomic (the count
    goes on past LIST, so the later rounds see that the list is not whole)."""
    slots = tl.cumsum(inside.to(tl.int32), 0)
    base = tl.atomic_add(listed_ptr, tl.max(slots, 0), sem="relaxed", scope="gpu")
    position = base + slots - 1
    tl.store(list_row + position, offs, mask=inside & (position < LIST))


@triton.jit
def race_listed(src, list_row, listed, chunk, floor, inv_temperature, s_max, hash_of_row, weigh,
                vocab_size: tl.constexpr, P: tl.constexpr, KEY_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    """A later round's share of a listed row (list blocks chunk, chunk + P, ...): race_above's
    (best, token, count, weight, total, mass) over the listed tokens above `floor` (total and mass are the first
    round's alone: 0 here). The scores are race_above's bits; the list has no order, so ties go to the lower id."""
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_token = tl.full([BLOCK], vocab_size, tl.int32)
    count = tl.zeros([BLOCK], tl.int32)
    weight = tl.zeros([BLOCK], tl.int64)
    for start in range(0, listed, P * BLOCK):
        i = start + chunk * BLOCK + tl.arange(0, BLOCK)
        valid = i < listed
        ids = tl.load(list_row + i, mask=valid, other=0, cache_modifier=".cg")  # written in this launch
        x = canonical(tl.load(src + ids, mask=valid, other=float("-inf")))
        inside = valid & (x > floor)  # listed tokens are the ones min_p keeps
        count += inside.to(tl.int32)
        if weigh:
            weight += tl.where(inside, top_p_weight(x, inv_temperature, s_max), 0)
        score = race_score(x * inv_temperature, inside, hash_of_row, ids, KEY_BYTES)
        best, best_token = race_take_unordered(score, ids, best, best_token)
    top = tl.max(best, 0)
    return (top, tl.min(tl.where(best == top, best_token, vocab_size), 0), tl.sum(count, 0), tl.sum(weight, 0),
            tl.sum(tl.zeros([BLOCK], tl.int64), 0), tl.sum(tl.zeros([BLOCK], tl.float32), 0))
