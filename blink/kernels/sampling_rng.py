"""Counter-based RNG of the sampler: a uniform per (seed, position, token id), in torch and in Triton.

A row's hash is murmur3_32's body keyed by the seed's low word over the words (seed_hi, position); a token's
uniform is then, by BLINK_SAMPLER_HASH, fmix32(row ^ token * 0x9E3779B9) ("fmix", the default since session 41)
or murmur3's body round over the token and its finaliser ("murmur", the stream before). The torch reference
(int64 tensors with explicit 32-bit masking) and the Triton version (uint32, which wraps by itself) compute the
same bits, so a seeded request draws the same tokens whatever shares its batch.

fmix costs 8 fewer of the 60 PTX instructions a token's race takes (session 40's count) and is as well mixed
(fmix32 is a bijection with full avalanche; the odd multiplier spreads consecutive ids over all bits). Session 41
(H100, perf.md, mean of 8 draws, murmur -> fmix): temperature at 32 rows 40.7 -> 39.4 us, min_p 64.2 -> 64.6,
top_p at one row 33.0 -> 32.7; 0 mismatches. It changes every seeded stream, not which tokens are likely.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

KEY_BYTES = 12  # three hashed words after the seed word
_MASK32 = 0xFFFFFFFF
_C1, _C2, _BODY_ADD = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_FMIX1, _FMIX2 = 0x85EBCA6B, 0xC2B2AE35


# ---- torch reference (int64 tensors holding uint32 values) ----------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 with c split in 16-bit halves, so no product leaves int64.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix_word_ref(h: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl32(_mul32(word, _C1), 15), _C2)
    h = _rotl32(h ^ k, 13)
    return (h * 5 + _BODY_ADD) & _MASK32


def _fmix32_ref(h: torch.Tensor) -> torch.Tensor:
    h = _mul32(h ^ (h >> 16), _FMIX1)
    h = _mul32(h ^ (h >> 13), _FMIX2)
    return h ^ (h >> 16)


HASH_MODES = ("murmur", "fmix")
_GOLDEN = 0x9E3779B9


def env_choice(name: str, choices: tuple[str, ...], default: str, value: str | None = None) -> str:
    """value, or the environment's `name` (default if unset), checked against choices; ValueError names `name`."""
    value = os.environ.get(name, default) if value is None else value
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def hash_setting(value: str | None = None) -> str:
    """BLINK_SAMPLER_HASH's mode (read once at import)."""
    return env_choice("BLINK_SAMPLER_HASH", HASH_MODES, "fmix", value)


HASH = hash_setting()


def race_uniform_ref(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                     mode: str | None = None) -> torch.Tensor:
    """[S, V] float32 uniforms in (0, 1) for the rows' (seed, position) and every token id (mode: HASH's)."""
    h = _mix_word_ref(seeds & _MASK32, (seeds >> 32) & _MASK32)
    h = _mix_word_ref(h, positions & _MASK32)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    if (mode or HASH) == "murmur":
        h = _fmix32_ref(_mix_word_ref(h[:, None], tokens[None, :]) ^ KEY_BYTES)
    else:
        h = _fmix32_ref(h[:, None] ^ _mul32(tokens, _GOLDEN)[None, :])
    return ((h >> 9).to(torch.float32) + 0.5) * 2.0**-23  # 23 bits: exact in f32, never 0 or 1


# ---- Triton -----------------------------------------------------------------------------------------
@triton.jit
def _rotl32_u32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def mix_word(h, word):
    k = _rotl32_u32(word * 0xCC9E2D51, 15) * 0x1B873593
    h = _rotl32_u32(h ^ k, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix32(h):
    h = (h ^ (h >> 16)) * 0x85EBCA6B
    h = (h ^ (h >> 13)) * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def row_hash(seed, position):
    """The per-row part of the hash: seed (i64) and position (i64) as uint32 words."""
    h = mix_word((seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    return mix_word(h, (position & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def _unit(h):
    """((h >> 9) + 0.5) 2^-23 without an int-to-float conversion: 1 + m 2^-23 by its bits, less 1 - 2^-24 (exact:
    Sterbenz), the same bits as the reference's."""
    return ((h >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 0.99999994039535522


@triton.jit
def _uniform_murmur(hash_of_row, tokens, KEY_BYTES: tl.constexpr):
    return _unit(_fmix32(mix_word(hash_of_row, tokens.to(tl.uint32)) ^ KEY_BYTES))


@triton.jit
def _uniform_fmix(hash_of_row, tokens, KEY_BYTES: tl.constexpr):
    return _unit(_fmix32(hash_of_row ^ (tokens.to(tl.uint32) * 0x9E3779B9)))


# the race's uniform of (row, token), by BLINK_SAMPLER_HASH; KEY_BYTES is murmur3's length word
race_uniform = {"murmur": _uniform_murmur, "fmix": _uniform_fmix}[HASH]
