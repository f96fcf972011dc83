"""Token sampling over per-slot parameters (blink/engine/sampling_state.py), CUDA-graph capturable.

Order (vLLM's): logit_bias, repetition penalty (prompt + output), presence/frequency penalties (output),
temperature, min_p, top_k, top_p, then the choice. Rows with temperature 0 take the argmax of the
penalized logits. Logprobs are those of the raw logits (log_softmax before any processing).

The choice is an exponential race: token = argmax_i p_i / E_i with E_i = -log(u_i), i.e. argmax of
logit_i / T - log(-log u_i) over the tokens the filters keep. u_i is a hash of (seed, position, token id)
(murmur3_32 keyed by the seed's low word over the words seed_hi, position, token), computed identically
by the torch reference (int64 with explicit 32-bit masking) and the Triton kernel (uint32), so a seeded
request draws the same tokens whatever shares its batch and in either engine.

min_p, top_k and top_p become one threshold per row on the penalized logits (keep x >= threshold),
found with a sort; ties at the threshold are kept. Nothing here syncs with the host or has a
data-dependent shape. Triton kernels: the penalties/bias pass and the final choice; the rest is torch.
A row whose slot is -1 is padding: greedy, no penalties. The kernels take the vocabulary size as a
compile-time constant: one compile per model, and the Triton 3.6 interpreter (numpy >= 2.4) cannot
loop up to a runtime scalar argument.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from blink.engine.sampling_state import SamplingState

_MASK32 = 0xFFFFFFFF
_C1, _C2, _BODY_ADD = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_FMIX1, _FMIX2 = 0x85EBCA6B, 0xC2B2AE35
_KEY_BYTES = 12  # three hashed words after the seed word


class SampleOutput(NamedTuple):
    token_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor  # [S] f32, raw logprob of the chosen token
    top_ids: torch.Tensor  # [S, K] int64
    top_logprobs: torch.Tensor  # [S, K] f32


# ---- counter-based RNG, torch reference (int64 tensors holding uint32 values) ----------------------
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


def race_uniform_ref(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[S, V] float32 uniforms in (0, 1) for the rows' (seed, position) and every token id."""
    h = _mix_word_ref(seeds & _MASK32, (seeds >> 32) & _MASK32)
    h = _mix_word_ref(h, positions & _MASK32)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _fmix32_ref(_mix_word_ref(h[:, None], tokens[None, :]) ^ _KEY_BYTES)
    return ((h >> 9).to(torch.float32) + 0.5) * 2.0**-23  # 23 bits: exact in f32, never 0 or 1


# ---- counter-based RNG, Triton (uint32 arithmetic wraps by itself) --------------------------------
@triton.jit
def _rotl32_u32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix_word(h, word):
    k = _rotl32_u32(word * 0xCC9E2D51, 15) * 0x1B873593
    h = _rotl32_u32(h ^ k, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix32(h):
    h = (h ^ (h >> 16)) * 0x85EBCA6B
    h = (h ^ (h >> 13)) * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _race_uniform(row_hash, tokens, KEY_BYTES: tl.constexpr):
    h = _fmix32(_mix_word(row_hash, tokens.to(tl.uint32)) ^ KEY_BYTES)
    return ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


# ---- final choice ----------------------------------------------------------------------------------
@triton.jit
def _choose_kernel(logits_ptr, threshold_ptr, slots_ptr, positions_ptr, temperature_ptr, seed_ptr, out_ptr,
                   vocab_size: tl.constexpr, KEY_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    temperature = tl.load(temperature_ptr + safe_slot)
    noisy = (temperature != 0.0) & (slot >= 0)
    inv_temperature = tl.math.div_rn(1.0, tl.where(noisy, temperature, 1.0))  # rounded as torch's '/'
    threshold = tl.load(threshold_ptr + row)
    seed = tl.load(seed_ptr + safe_slot)
    row_hash = _mix_word((seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    row_hash = _mix_word(row_hash, (tl.load(positions_ptr + row) & 0xFFFFFFFF).to(tl.uint32))
    row_ptr = logits_ptr + row.to(tl.int64) * vocab_size

    # Per-lane running max; a lane keeps its first maximum, the final reduce the lowest index: argmax.
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab_size, other=float("-inf"))
        if noisy:
            u = _race_uniform(row_hash, offs, KEY_BYTES)
            x = tl.where(x >= threshold, x * inv_temperature - tl.log(-tl.log(u)), float("-inf"))
        take = x > best
        best = tl.where(take, x, best)
        best_idx = tl.where(take, offs, best_idx)
    top = tl.max(best, 0)
    token = tl.min(tl.where(best == top, best_idx, vocab_size), 0)
    tl.store(out_ptr + row, tl.where(token < vocab_size, token, 0).to(tl.int64))


def choose_tokens_triton(logits: torch.Tensor, threshold: torch.Tensor, slots: torch.Tensor,
                         positions: torch.Tensor, state: SamplingState) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    _choose_kernel[(num_rows,)](
        logits, threshold, slots, positions, state.temperature, state.seed, out, vocab_size,
        KEY_BYTES=_KEY_BYTES, BLOCK=min(2048, triton.next_power_of_2(vocab_size)), num_warps=8,
    )
    return out


def choose_tokens_ref(logits: torch.Tensor, threshold: torch.Tensor, slots: torch.Tensor,
                      positions: torch.Tensor, state: SamplingState) -> torch.Tensor:
    safe_slots = slots.clamp(min=0).long()
    temperature = state.temperature[safe_slots][:, None]
    noisy = (temperature != 0) & (slots >= 0)[:, None]
    u = race_uniform_ref(state.seed[safe_slots], positions, logits.shape[1])
    raced = torch.where(logits >= threshold[:, None], logits * (1.0 / temperature) - torch.log(-torch.log(u)),
                        float("-inf"))
    scores = torch.where(noisy, raced, logits)
    return torch.where(scores.isnan(), float("-inf"), scores).argmax(dim=-1)


# ---- logit_bias and penalties ----------------------------------------------------------------------
@triton.jit
def _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence):
    seen = (count > 0) | (in_prompt != 0)
    x = tl.where(seen, tl.where(x > 0, x * inv_repetition, x * repetition), x)
    return x - frequency * count.to(tl.float32) - presence * (count > 0).to(tl.float32)


@triton.jit
def _penalties_kernel(logits_ptr, out_ptr, slots_ptr, flags_ptr, repetition_ptr, frequency_ptr, presence_ptr,
                      counts_ptr, prompt_mask_ptr, bias_ids_ptr, bias_vals_ptr, vocab_size: tl.constexpr,
                      NUM_BIAS: tl.constexpr, BIAS_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    safe_slot = tl.maximum(slot, 0)
    flags = tl.where(slot >= 0, tl.load(flags_ptr + safe_slot), 0)
    has_penalties = (flags & 1) != 0
    repetition = tl.load(repetition_ptr + safe_slot)
    inv_repetition = tl.math.div_rn(1.0, repetition)
    frequency = tl.load(frequency_ptr + safe_slot)
    presence = tl.load(presence_ptr + safe_slot)
    in_row = logits_ptr + row.to(tl.int64) * vocab_size
    out_row = out_ptr + row.to(tl.int64) * vocab_size
    history = safe_slot.to(tl.int64) * vocab_size  # row of output_counts / prompt_mask

    # Dense pass: a plain copy unless the slot has penalties (then, and only then, read its history).
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < vocab_size
        x = tl.load(in_row + offs, mask=mask)
        if has_penalties:
            count = tl.load(counts_ptr + history + offs, mask=mask, other=0)
            in_prompt = tl.load(prompt_mask_ptr + history + offs, mask=mask, other=0)
            x = _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence)
        tl.store(out_row + offs, x, mask=mask)

    # Biased tokens: bias comes first, so redo them from the raw logit (the penalty depends on its sign).
    if (flags & 2) != 0:
        tl.debug_barrier()  # the dense pass's stores to these tokens must land before ours
        b = tl.arange(0, BIAS_BLOCK)
        ids = tl.load(bias_ids_ptr + safe_slot.to(tl.int64) * NUM_BIAS + b, mask=b < NUM_BIAS, other=-1)
        vals = tl.load(bias_vals_ptr + safe_slot.to(tl.int64) * NUM_BIAS + b, mask=b < NUM_BIAS, other=0.0)
        used = ids >= 0
        x = tl.load(in_row + ids, mask=used, other=0.0) + vals
        if has_penalties:
            count = tl.load(counts_ptr + history + ids, mask=used, other=0)
            in_prompt = tl.load(prompt_mask_ptr + history + ids, mask=used, other=0)
            x = _penalize(x, count, in_prompt, repetition, inv_repetition, frequency, presence)
        tl.store(out_row + ids, x, mask=used)


def apply_penalties_triton(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    out = torch.empty_like(logits)
    num_bias = state.bias_ids.shape[1]
    _penalties_kernel[(num_rows,)](
        logits, out, slots, state.flags, state.repetition_penalty, state.frequency_penalty,
        state.presence_penalty, state.output_counts, state.prompt_mask, state.bias_ids, state.bias_vals,
        vocab_size, NUM_BIAS=num_bias, BIAS_BLOCK=triton.next_power_of_2(num_bias),
        BLOCK=min(2048, triton.next_power_of_2(vocab_size)), num_warps=8,
    )
    return out


def apply_penalties_ref(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    safe_slots = slots.clamp(min=0).long()
    flags = torch.where(slots >= 0, state.flags[safe_slots], 0)[:, None]
    bias_ids = state.bias_ids[safe_slots].long()
    bias_vals = torch.where((bias_ids >= 0) & ((flags & 2) != 0), state.bias_vals[safe_slots], 0.0)
    x = logits.scatter_add(1, bias_ids.clamp(min=0), bias_vals)

    counts = state.output_counts[safe_slots]
    seen = (counts > 0) | (state.prompt_mask[safe_slots] != 0)
    repetition = state.repetition_penalty[safe_slots][:, None]
    penalized = torch.where(seen, torch.where(x > 0, x * (1.0 / repetition), x * repetition), x)
    penalized = (penalized - state.frequency_penalty[safe_slots][:, None] * counts
                 - state.presence_penalty[safe_slots][:, None] * (counts > 0))
    return torch.where((flags & 1) != 0, penalized, x)


# ---- min_p / top_k / top_p as one threshold per row ------------------------------------------------
def keep_thresholds(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """[S] f32: the smallest penalized logit that min_p, then top_k, then top_p (renormalized) keep."""
    safe_slots = slots.clamp(min=0).long()
    temperature = state.temperature[safe_slots]
    temperature = torch.where(temperature == 0, 1.0, temperature)[:, None]  # greedy: filters moot
    top_k, top_p = state.top_k[safe_slots][:, None], state.top_p[safe_slots][:, None]
    min_p = state.min_p[safe_slots][:, None]

    ordered = torch.sort(logits, dim=-1, descending=True).values
    scaled = ordered / temperature
    rank = torch.arange(logits.shape[1], device=logits.device)[None, :]
    # min_p: p_i >= min_p * p_max  <=>  scaled_i >= scaled_max + log(min_p)
    kept = (scaled >= scaled[:, :1] + torch.log(min_p)) & ((top_k <= 0) | (rank < top_k))
    probs = torch.softmax(torch.where(kept, scaled, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    kept &= (mass_before < top_p) | (top_p >= 1)  # the first token always stays (mass_before = 0)
    num_kept = kept.sum(dim=-1, keepdim=True).clamp(min=1)
    return ordered.gather(1, num_kept - 1).squeeze(1)


# ---- the whole step --------------------------------------------------------------------------------
def _sample(logits, slots, positions, state, max_top_logprobs, apply_penalties, choose_tokens):
    assert logits.shape[1] == state.vocab_size, "logits and sampling state disagree on the vocab size"
    logits = logits.float().contiguous()
    penalized = apply_penalties(logits, slots, state)
    threshold = keep_thresholds(penalized, slots, state)
    token_ids = choose_tokens(penalized, threshold, slots, positions, state)

    normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
    logprobs = (logits.gather(1, token_ids[:, None]) - normalizer).squeeze(1)
    top_logits, top_ids = torch.topk(logits, max_top_logprobs, dim=-1)
    return SampleOutput(token_ids, logprobs, top_ids, top_logits - normalizer)


def sample_ref(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
               max_top_logprobs: int) -> SampleOutput:
    return _sample(logits, slots, positions, state, max_top_logprobs, apply_penalties_ref, choose_tokens_ref)


def sample_triton(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
                  max_top_logprobs: int) -> SampleOutput:
    return _sample(logits, slots, positions, state, max_top_logprobs, apply_penalties_triton,
                   choose_tokens_triton)


def sample(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
           max_top_logprobs: int) -> SampleOutput:
    """logits [S, V] f32, slots [S] int32 (-1: padding), positions [S] int64 (of the sampled token)."""
    impl = sample_triton if logits.is_cuda else sample_ref
    return impl(logits, slots, positions, state, max_top_logprobs)
