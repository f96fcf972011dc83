"""Float sums with integer bounds for the rejection's top_p test (sampling_reject).

sampling_ref weighs a token floor(exp(s - s_max) * 2^32) as an int64, so that sums do not depend on their order. The
rejection needs two such sums a row: the total over min_p's set, and the mass above its candidate. Both can be read
off float sums of the same exps instead, with bounds: a float sum of n positive terms is within about
(terms a lane + log2 BLOCK) * 2^-24 of the exact sum (under 1e-5 at the plans' at most ~128 terms a lane), and each
floor loses under one unit. SLACK (2^-12) covers that ~25x over, and a comparison the bounds cannot decide (a
budget within ~2^-12 of the mass, so rarely) is left to an exact pass: the next round, or the search.
  - row_total_bounds: the total from the first race's chunk sums, each relative to the chunk's own maximum (the
    row's is not known while the penalties kernel runs), so that no round weighs every token.
  - mass_bounds: the mass above a candidate from float sums (sampling_reject_pass.race_above without its race), for a
    first round that only tests its candidate (no race, no float-to-int64 conversion nor int64 adds a token): one
    read of the row at about the cost of a streaming pass.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_select import key_value

BOUND_SLACK = 2.0**-12
_SCALE = tl.constexpr(4294967296.0)  # sampling_ref.WEIGHT_SCALE


@triton.jit
def row_total_bounds(mass_ptr, key_max_ptr, row, inv_temperature, s_max, vocab_size: tl.constexpr, P: tl.constexpr,
                     P_PAD: tl.constexpr, SLACK: tl.constexpr):
    """Integer bounds lo <= total <= hi on the row's exact top_p total over all its tokens, from the chunks' float
    sums of exp(s - s_chunk) (sampling_reject.first_race) rescaled by exp(s_chunk - s_max)."""
    c = tl.arange(0, P_PAD)
    mass = tl.load(mass_ptr + row * P + c, mask=c < P, other=0.0)
    s_chunk = key_value(tl.load(key_max_ptr + row * P + c, mask=c < P, other=0)) * inv_temperature
    scaled = tl.where(mass > 0.0, mass * tl.exp(s_chunk - s_max), 0.0).to(tl.float64)
    approx = tl.sum(scaled, 0) * _SCALE
    lo = tl.maximum(approx * (1.0 - SLACK) - vocab_size, 0.0).to(tl.int64)  # truncation: a floor of positives
    hi = (approx * (1.0 + SLACK)).to(tl.int64) + 1
    return lo, hi


@triton.jit
def mass_bounds(part_mass_ptr, row, above, P: tl.constexpr, P_PAD: tl.constexpr, SLACK: tl.constexpr):
    """Float64 bounds lo <= mass <= hi on the exact integer mass of the `above` tokens whose float exps the
    chunks summed."""
    c = tl.arange(0, P_PAD)
    # written by the row's other programs, in the same launch when the rounds share one (sampling_reject_sync: ".cg")
    mass = tl.load(part_mass_ptr + row * P + c, mask=c < P, other=0.0, cache_modifier=".cg")
    approx = tl.sum(mass.to(tl.float64), 0) * _SCALE
    return tl.maximum(approx * (1.0 - SLACK) - above.to(tl.float64), 0.0), approx * (1.0 + SLACK)
