"""A rejection round's end for its row (sampling_reject): keep the candidate, take the next one, or leave the row to
the threshold search. The row's last program in a round calls it, whether the row's own programs ran the round
(sampling_reject._round) or the launch's whole pool of programs did (sampling_reject_pool)."""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_bucket import top_p_weight
from blink.kernels.sampling_plan import DECIDED, PENDING, SEARCH
from blink.kernels.sampling_select import canonical


@triton.jit
def keeps(value, inv_temperature, cutoff, top_k, top_p, above, mass_hi, total_lo):
    """Whether the candidate is surely kept (min_p keeps it, fewer than top_k tokens lie above it and, mass_hi
    bounding their weight from above, they weigh less than top_p of the row's total, total_lo bounding it from
    below), and whether its counts alone keep it (min_p and top_k)."""
    counts_keep = (value * inv_temperature >= cutoff) & ((top_k <= 0) | (above < top_k))
    # sampling_ref's budget, top_p * total in float64, is at least this (rounding is monotone)
    budget = top_p.to(tl.float64) * total_lo.to(tl.float64)
    return counts_keep & ((top_p >= 1.0) | (mass_hi < budget)), counts_keep


@triton.jit
def decide(state, race_ids_ptr, row, src, candidate, value, inv_temperature, s_max, cutoff, top_k, top_p, above,
           mass_lo, mass_hi, total_lo, total_hi, following, vocab_size: tl.constexpr, RACE: tl.constexpr):
    """From the round's count of tokens above the candidate, bounds mass_lo <= mass <= mass_hi on their weight
    (float64), the row's total's bounds and the race winner above the candidate (`following`, vocab_size if none):
    the row's new state words (DECIDED with its race list of one token, PENDING with the next candidate, SEARCH);
    whether it is still pending."""
    # sampling_ref's budget, top_p * total in float64, lies between these two (rounding is monotone)
    budget = top_p.to(tl.float64) * total_lo.to(tl.float64)
    budget_hi = top_p.to(tl.float64) * total_hi.to(tl.float64)
    kept, counts_keep = keeps(value, inv_temperature, cutoff, top_k, top_p, above, mass_hi, total_lo)
    refused = ~counts_keep | ((top_p < 1.0) & (mass_lo >= budget_hi))
    # SEARCH: the total's bounds straddle the budget (never when exact), or nothing is kept above a refused
    # candidate (only when top_p is 0)
    status = tl.full([], SEARCH, tl.int64)
    if kept:
        tl.store(race_ids_ptr + row * RACE, candidate)
        tl.store(state + 1, candidate.to(tl.int64))  # the resolve's threshold
        status = tl.full([], DECIDED, tl.int64)
    elif refused & (following < vocab_size):
        tl.store(state + 1, following.to(tl.int64))
        # The next candidate w' lies above the candidate, and so does every token above w': its count and weight
        # above are at most the candidate's less w' itself. When those bounds pass, w' is kept and, as the race's
        # winner over a superset of the kept set, is the row's token now (always for min_p alone; for top_p when w'
        # is heavy). Else the next round tests it exactly.
        w_next = top_p_weight(canonical(tl.load(src + following)), inv_temperature, s_max)
        surely = (((top_k <= 0) | (above - 1 < top_k))
                  & ((top_p >= 1.0) | (mass_hi - w_next.to(tl.float64) < budget)))
        status = tl.full([], PENDING, tl.int64)
        if surely:
            tl.store(race_ids_ptr + row * RACE, following)
            status = tl.full([], DECIDED, tl.int64)
    tl.store(state, status)
    return status == PENDING
