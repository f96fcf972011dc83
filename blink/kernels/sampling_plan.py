"""The keep-threshold search's plan over buckets (sampling_bucket's kernels call it), at two levels.

A token kept by min_p has a distance d = s_max - x / T >= 0 from the row's largest scaled logit. The coarse
level buckets d in [0, 32) into NB buckets of 1 / U (U = NB / 32, a power of two; the last bucket also holds
everything beyond); the fine level splits the coarse range [J_lo, J_hi] that must hold the threshold into
R sub-buckets per coarse bucket (R a power of two, R * span <= NB), so a fine bucket is 1 / (U * R) wide.
Both levels compute the same bucket of a token from one f32 value, `scaled = d * U`: the coarse bucket is
floor(scaled), the fine one floor(scaled * R) - J_lo * R (scaling by a power of two is exact), so the two
always agree. A plan is sound whatever the widths: top_k uses exact counts, top_p lower and upper bounds of
each bucket's weight, tightened through the row's exact total; if a plan were ever unsound the resolve notices
and searches the row instead (and says so in its fallback flag: tests and the micro-bench count them).
"""
from __future__ import annotations

import triton
import triton.language as tl

_TWO_32 = tl.constexpr(4294967296.0)


@triton.jit
def scaled_distance(x, inv_temperature, s_max, NB: tl.constexpr):
    """d * U in f32; NaN for a row of -inf (it lands in the last bucket of either level)."""
    return (s_max - x * inv_temperature) * (NB / 32.0)


@triton.jit
def coarse_bucket(scaled, NB: tl.constexpr):
    return tl.where(scaled < NB - 1, scaled, NB - 1).to(tl.int32)  # NaN and far tokens: the last bucket


@triton.jit
def refinement(span, NB: tl.constexpr, LOG2_NB: tl.constexpr):
    """R: the largest power of two with R * span <= NB (span <= NB coarse buckets)."""
    r = tl.full([], NB, tl.int32)
    for _ in tl.static_range(LOG2_NB):
        r = tl.where((r * span > NB) & (r > 1), r // 2, r)
    return r


@triton.jit
def fine_bucket(scaled, r, j_lo, span):
    """The fine bucket of a token inside the coarse range (the last one also holds what the coarse one did)."""
    limit = (span * r - 1).to(tl.float32)
    v = scaled * r.to(tl.float32) - (j_lo * r).to(tl.float32)  # both < 2^17: exact
    return tl.where(v < limit, v, limit).to(tl.int32)


@triton.jit
def _weights(first, j, per_unit, open_bucket):
    """Fixed-point weight bounds per token of bucket j: w_min at its far edge, w_max at its near edge
    (1e-5: exp's error in f32, with room to spare; the open bucket reaches to weight 0)."""
    jf = (first + j).to(tl.float64)
    w_min = tl.where(j != open_bucket, tl.exp(-(jf + 1.0) / per_unit) * _TWO_32 * (1.0 - 1e-5) - 1.0, 0.0)
    return tl.maximum(w_min, 0.0), tl.exp(-jf / per_unit) * _TWO_32 * (1.0 + 1e-5) + 1.0


@triton.jit
def plan_level(hist_row, first, per_unit, open_bucket, base_count, base_mass, total, tail_lower, tail_upper, num_kept,
               top_k, top_p, budget, NB: tl.constexpr):
    """The bucket range [j_lo, j_hi] of this level that holds the threshold, the kept tokens before it and in it.

    Bucket j covers d in [first + j, first + j + 1) / per_unit, except `open_bucket`, which reaches to infinity
    (-1: none). Before bucket 0 lie base_count tokens of exact fixed-point weight base_mass; after the last,
    tokens of weight in [tail_lower, tail_upper]; the row's exact total is `total`. The weight before or through
    a bucket is bounded from its side and, through the total, from the other side: the second bound is the
    tight one near the end of the row, where a top_p close to 1 puts its threshold. Every program of a row
    computes the same plan from the same histogram."""
    j = tl.arange(0, NB)
    counts = tl.load(hist_row + j)
    cumulative = tl.cumsum(counts, 0) + base_count
    top_k_active = (top_k > 0) & (top_k < num_kept)
    j_k = tl.sum((cumulative < top_k).to(tl.int32), 0)  # the first bucket that reaches k tokens
    w_min, w_max = _weights(first, j, per_unit, open_bucket)
    _, w_max_prev = _weights(first, j - 1, per_unit, open_bucket)
    counts_prev = tl.load(hist_row + j - 1, mask=j > 0, other=0).to(tl.float64)
    counts_next = tl.load(hist_row + j + 1, mask=j < NB - 1, other=0).to(tl.float64)
    _, w_max_next = _weights(first, j + 1, per_unit, open_bucket)
    base, whole = base_mass.to(tl.float64), total.to(tl.float64)
    # (1 -+ 1e-9): the f64 sums' rounding, with room to spare; the sums of positive terms run from their side.
    lower_through = (base + tl.cumsum(counts.to(tl.float64) * w_min, 0)) * (1.0 - 1e-9)
    upper_after = (tl.cumsum(counts_next * w_max_next, 0, reverse=True) + tail_upper) * (1.0 + 1e-9)
    lower = tl.maximum(lower_through, (whole - upper_after) * (1.0 - 1e-9))  # weight through j, at least
    upper_before = (base + tl.cumsum(counts_prev * w_max_prev, 0)) * (1.0 + 1e-9)
    lower_from = (tl.cumsum(counts.to(tl.float64) * w_min, 0, reverse=True) + tail_lower) * (1.0 - 1e-9)
    upper_before = tl.minimum(upper_before, (whole - lower_from) * (1.0 + 1e-9))  # weight before j, at most
    # top_p: the range from the last bucket with not all of the budget before it to the first with all of it
    # (with top_k too, top_p's total is over the top_k set: take all of it); top_k alone: its k-th token's
    # bucket; min_p alone (or a top_k that keeps everything): no candidates, the smallest kept token.
    p_lo = tl.maximum(tl.sum((upper_before < budget).to(tl.int32), 0) - 1, 0)
    p_hi = tl.minimum(tl.sum((lower < budget).to(tl.int32), 0), NB - 1)
    j_lo = tl.where(top_p < 1.0, tl.where(top_k_active, 0, p_lo), tl.where(top_k_active, j_k, NB))
    j_hi = tl.where(top_k_active, j_k, tl.where(top_p < 1.0, p_hi, -1))
    num_above = base_count + tl.sum(tl.where(j < j_lo, counts, 0), 0)
    num_candidates = tl.sum(tl.where((j >= j_lo) & (j <= j_hi), counts, 0), 0)
    return top_k_active, j_lo, j_hi, num_above, num_candidates


@triton.jit
def plan_coarse(hist_row, part_total_row, top_k, top_p, NB: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """Level 1 over the row's coarse histogram: (top_k_active, j_lo, j_hi, num_above, num_candidates, num_kept,
    total, budget)."""
    num_kept = tl.sum(tl.load(hist_row + tl.arange(0, NB)), 0)
    c = tl.arange(0, P_PAD)
    total = tl.sum(tl.load(part_total_row + c, mask=c < P, other=0), 0)
    budget = top_p.to(tl.float64) * total.to(tl.float64)  # sampling_ref's budget
    zero = tl.zeros([], tl.float64)
    top_k_active, j_lo, j_hi, num_above, num_candidates = plan_level(
        hist_row, 0, NB / 32.0, NB - 1, 0, tl.zeros([], tl.int64), total, zero, zero, num_kept, top_k, top_p,
        budget, NB)
    return top_k_active, j_lo, j_hi, num_above, num_candidates, num_kept, total, budget


@triton.jit
def plan_fine(hist_row, j_lo, j_hi, r, num_above, mass_above, total, num_kept, top_k, top_p, budget,
              NB: tl.constexpr):
    """Level 2 over the fine histogram (stored after the coarse one) of the coarse range [j_lo, j_hi]:
    num_above / mass_above are the coarse level's kept tokens before j_lo and their exact weight; the coarse
    buckets after j_hi bound the weight after the range."""
    j = tl.arange(0, NB)
    after = tl.where(j > j_hi, tl.load(hist_row + j), 0).to(tl.float64)
    w_min, w_max = _weights(0, j, NB / 32.0, NB - 1)
    span = j_hi - j_lo + 1
    open_bucket = tl.where(j_hi == NB - 1, span * r - 1, -1)
    return plan_level(hist_row + NB, j_lo * r, (NB / 32.0) * r.to(tl.float64), open_bucket, num_above, mass_above,
                      total, tl.sum(after * w_min, 0), tl.sum(after * w_max, 0), num_kept, top_k, top_p, budget, NB)


# The row's plan, computed once (by the refine kernel's last program of the row) and read by the compaction
# and the resolve, which before recomputed both levels in every program (about 2 us each on the H200's
# profile, session 10). int64 words: top_k_active, j_lo, j_hi, r, f_lo, f_hi, num_above, num_candidates,
# total (f_lo > f_hi and no candidates when the coarse range is empty).
PLAN_WORDS = tl.constexpr(16)
# int32 words per row of the selection's `counters`: candidates taken, top-K candidates taken, the refine
# kernel's ticket, the race list's ids taken (sampling_race.LIST_COUNTER), the rejection's ticket
# (REJECT_TICKET) and its rounds released (REJECT_RELEASED), in row 0 only the rejection's cells handed out
# (REJECT_CELLS; sampling_reject_sync), one spare; the penalties kernel zeroes them
COUNTERS = tl.constexpr(8)
REJECT_TICKET, REJECT_RELEASED, REJECT_CELLS = tl.constexpr(4), tl.constexpr(5), tl.constexpr(6)
# int32 words of the rejection's pool rounds (sampling_reject_pool, plan.pool_words): its claims, entries reserved and
# rows done, each on a 128-byte line of its own (hundreds of programs poll them), then QUEUE_PER_ROW queue entries a
# row from POOL_QUEUE on; the penalties kernel zeroes them
POOL_CLAIM, POOL_TAIL, POOL_DONE, POOL_QUEUE = tl.constexpr(0), tl.constexpr(32), tl.constexpr(64), tl.constexpr(96)
QUEUE_PER_ROW = tl.constexpr(8)  # a row is queued at most once a round after the first
# int64 words per row of the rejection's state (sampling_reject): its status, the candidate token, and bounds
# lo <= hi on the row's top_p weight total (equal when the first round weighed it). PENDING rows still test a
# candidate, DECIDED rows chose it (the search skips them), SEARCH
# rows take the threshold search as without the rejection.
REJECT_WORDS = tl.constexpr(4)
PENDING, DECIDED, SEARCH = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def decided(reject_ptr, row):
    """Whether the rejection chose this row's token (read only where it ran: its state is not written else)."""
    return tl.load(reject_ptr + row * REJECT_WORDS) == DECIDED


@triton.jit
def store_row_plan(plan_row, top_k_active, j_lo, j_hi, r, f_lo, f_hi, num_above, num_candidates, total):
    tl.store(plan_row + 0, top_k_active.to(tl.int64))
    tl.store(plan_row + 1, j_lo.to(tl.int64))
    tl.store(plan_row + 2, j_hi.to(tl.int64))
    tl.store(plan_row + 3, r.to(tl.int64))
    tl.store(plan_row + 4, f_lo.to(tl.int64))
    tl.store(plan_row + 5, f_hi.to(tl.int64))
    tl.store(plan_row + 6, num_above.to(tl.int64))
    tl.store(plan_row + 7, num_candidates.to(tl.int64))
    tl.store(plan_row + 8, total.to(tl.int64))


@triton.jit
def load_row_plan(plan_row):
    """(top_k_active, j_lo, j_hi, r, f_lo, f_hi, num_above, num_candidates, total), as store_row_plan took them."""
    return (tl.load(plan_row + 0) != 0, tl.load(plan_row + 1).to(tl.int32), tl.load(plan_row + 2).to(tl.int32),
            tl.load(plan_row + 3).to(tl.int32), tl.load(plan_row + 4).to(tl.int32), tl.load(plan_row + 5).to(tl.int32),
            tl.load(plan_row + 6).to(tl.int32), tl.load(plan_row + 7).to(tl.int32), tl.load(plan_row + 8))


def log2_buckets(num_buckets: int) -> int:
    """LOG2_NB for the launches."""
    assert num_buckets >= 32 and num_buckets & (num_buckets - 1) == 0, "num_buckets: a power of two >= 32"
    return num_buckets.bit_length() - 1
