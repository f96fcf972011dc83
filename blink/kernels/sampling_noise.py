"""The race's noise: -log(-log u) for the hash's 23-bit uniform u (sampling_rng), in Triton.

The race adds each token's noise -log(-log u) (race_noise); race_score is the one place every race (the row stream,
the list race, the rejection's rounds) computes a token's score, so their draws agree bit for bit. The noise's two
accurate logs are most of a raced token's instructions (libdevice's logf: ~25 each, against ~20 for the hash), so
BLINK_SAMPLER_NOISE chooses how the GPU computes them: "exact" (both libdevice's), "fast" (the outer log by
lg2.approx: its argument -log u is never near 1 where it matters, see race_noise) or "fast2" (the inner one too:
lg2.approx below u = 1/2, a series above). The formula is the same in every mode; the fast ones round differently by
about an ulp of a score, so a GPU draw can differ from the CPU reference's only where two scores lie that close.
Session 40 (H100, perf.md): over all 2^23 u the error over max(1, |noise|) is 1.4e-7 / 2.6e-7 / 4.0e-7 (exact / fast
/ fast2); fast2 against exact, mean of 2 draws at 32 rows with the engine's two rounds: top_p 94.1 -> 85.0 us, min_p
74.2 -> 66.7, temperature 44.9 -> 42.0, greedy and top_k within 0.6; 0 mismatches. So fast2 is the default.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from blink.kernels.sampling_rng import env_choice, race_uniform

NOISE_MODES = ("exact", "fast", "fast2")


def noise_setting(value: str | None = None) -> str:
    """BLINK_SAMPLER_NOISE's mode (read once at import)."""
    return env_choice("BLINK_SAMPLER_NOISE", NOISE_MODES, "fast2", value)


NOISE = noise_setting()
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _log2_fast(x):
    return libdevice.fast_log2f(x)  # lg2.approx.ftz: ~2^-22 absolute error on the mantissa's log


@triton.jit
def _log2_interpreted(x):
    return tl.log2(x)  # the interpreter has no lg2.approx: the CPU tests run the same formula with numpy's log2


_log2 = _log2_interpreted if os.environ.get("TRITON_INTERPRET") == "1" else _log2_fast


@triton.jit
def _noise_exact(u):
    return -tl.log(-tl.log(u))


@triton.jit
def _noise_fast(u):
    # e = -log u lies in [1.2e-7, 16.6]; lg2.approx's error is absolute in the result, ~1.1e-7 after the ln 2
    # scale, below half an ulp of a score above 2 (the race's winners have large noise: e small, log e large)
    return -_LN2 * _log2(-tl.log(u))


@triton.jit
def inner_log_fast(u):
    """-log u for the race's u (23-bit, in (0, 1)). Below 1/2, lg2.approx: -log u > 0.69 there, so its absolute
    error is a relative one of ~2^-22. From 1/2 up, where -log u -> 0 and an absolute error would not do, the
    series -log(1 - w) = 2 atanh(t), t = w / (2 - w) <= 1/3, to t^13 (truncation below 2^-25 relative); w = 1 - u
    is exact there (Sterbenz)."""
    w = 1.0 - u
    t = w / (2.0 - w)  # div.full.f32 on the GPU: within 2 ulps
    t2 = t * t
    poly = 1.0 / 13.0
    poly = poly * t2 + 1.0 / 11.0
    poly = poly * t2 + 1.0 / 9.0
    poly = poly * t2 + 1.0 / 7.0
    poly = poly * t2 + 1.0 / 5.0
    poly = poly * t2 + 1.0 / 3.0
    poly = poly * t2 + 1.0
    return tl.where(u >= 0.5, 2.0 * t * poly, -_LN2 * _log2(u))


@triton.jit
def _noise_fast2(u):
    return -_LN2 * _log2(inner_log_fast(u))


# the race's noise -log(-log u), by BLINK_SAMPLER_NOISE (a score is scaled + race_noise(u))
race_noise = {"exact": _noise_exact, "fast": _noise_fast, "fast2": _noise_fast2}[NOISE]


@triton.jit
def race_score(scaled, keep, hash_of_row, ids, KEY_BYTES: tl.constexpr):
    """A token's score in the race: its scaled logit plus its noise where `keep`, else -inf (the one formula the
    row stream, the list race and the rejection's rounds share, so their draws agree bit for bit)."""
    return tl.where(keep, scaled + race_noise(race_uniform(hash_of_row, ids, KEY_BYTES)), float("-inf"))
