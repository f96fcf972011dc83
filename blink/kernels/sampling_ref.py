"""The sampler's torch reference: the definition the Triton pipeline (sampling.py) must match exactly.

Order (vLLM's): logit_bias, repetition penalty (prompt + output), presence/frequency penalties (output),
the grammar's mask (sampling_grammar_advance: disallowed tokens -> -inf), temperature, min_p, top_k, top_p,
then the choice. Temperature-0 rows take the argmax of the processed logits and skip the filters.
Logprobs are those of the raw logits.

The choice is an exponential race: token = argmax of x / T - log(-log u) over the kept tokens, u from
sampling_rng (a hash of seed, position and token id).

min_p, top_k and top_p become one threshold per row on the processed logits x (keep x >= threshold, so
ties at the threshold are kept). Defined on the descending sort of the row, with s = x * (1 / T):
  min_p: keep s >= s_max + log(min_p);  top_k: keep x >= the k-th largest x (its ties too);
  top_p: weight w = floor(exp(s - s_max) * 2^32) as an int64 (exact, so sums do not depend on their
         order), over the tokens min_p and top_k keep; keep a token while the weight of the tokens sorted
         before it is < top_p * (their total), compared in float64 (so the first of a run of ties
         decides for all of them).
The threshold is the value of the last kept token. NaN logits count as -inf and -0.0 as +0.0 here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from blink.kernels.sampling_grammar_advance import grammar_mask_ref
from blink.kernels.sampling_rng import race_uniform_ref

if TYPE_CHECKING:
    from blink.kernels.sampling_state import SamplingState

WEIGHT_SCALE = 2.0**32  # fixed point of the top_p weights


class SampleOutput(NamedTuple):
    token_ids: torch.Tensor  # [S] int64
    logprobs: torch.Tensor  # [S] f32, raw logprob of the chosen token
    top_ids: torch.Tensor  # [S, K] int64 (-1 in rows whose slot asks for no logprobs)
    top_logprobs: torch.Tensor  # [S, K] f32 (-inf in those rows)


def canonical(logits: torch.Tensor) -> torch.Tensor:
    """NaN as -inf and -0.0 as +0.0: the order the kernels' integer keys see."""
    return torch.where(logits.isnan(), float("-inf"), torch.where(logits == 0, 0.0, logits))


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
    x = torch.where((flags & 1) != 0, penalized, x)
    return torch.where(grammar_mask_ref(x, slots, state), x, float("-inf"))


def keep_thresholds(logits: torch.Tensor, slots: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """[S] f32: the smallest processed logit that min_p, then top_k, then top_p keep (-inf: keep all)."""
    safe_slots = slots.clamp(min=0).long()
    temperature = state.temperature[safe_slots][:, None]
    top_k, top_p = state.top_k[safe_slots][:, None], state.top_p[safe_slots][:, None]
    min_p = state.min_p[safe_slots][:, None]
    noisy = (temperature != 0) & (slots >= 0)[:, None]
    filtered = noisy & ((top_k > 0) | (top_p < 1) | (min_p > 0))

    ordered = torch.sort(canonical(logits), dim=-1, descending=True).values
    scaled = ordered * (1.0 / torch.where(noisy, temperature, 1.0))
    s_max = scaled[:, :1]
    kth = ordered.gather(1, top_k.clamp(1, logits.shape[1]).long() - 1)  # ties with it stay too
    kept = ((min_p <= 0) | (scaled >= s_max + torch.log(min_p))) & ((top_k <= 0) | (ordered >= kth))
    weights = torch.where(kept, (torch.exp(scaled - s_max) * WEIGHT_SCALE).to(torch.int64), 0)
    mass_before = torch.cumsum(weights, dim=-1) - weights
    budget = top_p.double() * weights.sum(dim=-1, keepdim=True).double()
    kept &= (top_p >= 1) | (mass_before.double() < budget)  # the first token always stays
    num_kept = kept.sum(dim=-1, keepdim=True).clamp(min=1)
    threshold = ordered.gather(1, num_kept - 1)
    return torch.where(filtered, threshold, float("-inf")).squeeze(1)


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


def top_logprobs_ref(logits: torch.Tensor, normalizer: torch.Tensor, slots: torch.Tensor, state: SamplingState,
                     max_top_logprobs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K largest raw logits (ties: lower id first) minus log-sum-exp, for rows whose slot asks."""
    top_logits, top_ids = torch.sort(canonical(logits), dim=-1, descending=True, stable=True)
    top_logits, top_ids = top_logits[:, :max_top_logprobs], top_ids[:, :max_top_logprobs]
    asks = ((slots >= 0) & (state.num_logprobs[slots.clamp(min=0).long()] > 0))[:, None]
    return (torch.where(asks, top_ids, -1),
            torch.where(asks, top_logits - normalizer[:, None], float("-inf")))


def sample_ref(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, state: SamplingState,
               max_top_logprobs: int) -> SampleOutput:
    assert logits.shape[1] == state.vocab_size, "logits and sampling state disagree on the vocab size"
    logits = logits.float().contiguous()
    penalized = apply_penalties_ref(logits, slots, state)
    threshold = keep_thresholds(penalized, slots, state)
    token_ids = choose_tokens_ref(penalized, threshold, slots, positions, state)

    normalizer = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(1, token_ids[:, None]).squeeze(1) - normalizer
    top_ids, top_logprobs = top_logprobs_ref(logits, normalizer, slots, state, max_top_logprobs)
    return SampleOutput(token_ids, logprobs, top_ids, top_logprobs)
