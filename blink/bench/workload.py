"""Benchmark workloads: random-token prompts, ShareGPT conversations (file or synthetic), arrival times.

Everything is seeded: the same seed gives the same prompts, lengths and arrival schedule.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

# Synthetic ShareGPT lengths. Means: the ShareGPT statistics in the vLLM paper (Kwon et al., SOSP 2023,
# Fig. 11: mean input 161.31 tokens, mean output 337.99 tokens). Shape: our assumption, a log-normal
# with sigma 1.0 (those histograms are right-skewed with a long tail). Bounds: the filter vLLM applies to
# the real file (both lengths >= 4, prompt <= 1024, prompt + output <= 2048), so the file and the
# synthetic variant yield comparable requests. Clipping lowers the means by a few percent.
SHAREGPT_MEAN_INPUT = 161.31
SHAREGPT_MEAN_OUTPUT = 337.99
SHAREGPT_LOGNORMAL_SIGMA = 1.0
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT = 1024
SHAREGPT_MAX_TOTAL = 2048

# Separate random streams so that, e.g., changing the rate leaves the prompts unchanged.
PROMPT_STREAM, LENGTH_STREAM, ARRIVAL_STREAM, SHUFFLE_STREAM = 1, 2, 3, 4


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens of `prompt` without special tokens
    expected_output_len: int  # sent as max_tokens


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def length_bounds(mean_len: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive [low, high] of uniform lengths around `mean_len`; ratio 0 gives exactly `mean_len`."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("--random-range-ratio must be in [0, 1)")
    low = max(1, math.floor(mean_len * (1.0 - range_ratio)))
    high = max(low, math.ceil(mean_len * (1.0 + range_ratio)))
    return low, high


def sample_lengths(rng: np.random.Generator, mean_len: int, range_ratio: float, n: int) -> np.ndarray:
    low, high = length_bounds(mean_len, range_ratio)
    return rng.integers(low, high + 1, size=n)


def random_token_prompt(codec, rng: np.random.Generator, num_tokens: int,
                        attempts: int = 10) -> tuple[str, int]:
    """Text that re-tokenizes to `num_tokens` tokens (almost always exactly), from random token ids.

    Decoding arbitrary ids and encoding the text again can merge or split tokens, so the ids are re-read
    from the text; the tail is redrawn (a cut alone can re-merge the same way every time) or topped up
    with fresh random ids until the round trip gives the length. Returns the text and its real length.
    """
    candidates = codec.candidate_ids()
    ids = list(rng.choice(candidates, size=num_tokens))
    text = codec.decode(ids)
    for _ in range(attempts):
        ids = codec.encode(text)
        if len(ids) == num_tokens:
            return text, num_tokens
        keep = min(len(ids), num_tokens - 1)
        ids = ids[:keep] + list(rng.choice(candidates, size=num_tokens - keep))
        text = codec.decode(ids)
    return text, len(codec.encode(text))


def random_requests(codec, num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[SampleRequest]:
    length_rng = stream_rng(seed, LENGTH_STREAM)
    input_lens = sample_lengths(length_rng, input_len, range_ratio, num_prompts)
    output_lens = sample_lengths(length_rng, output_len, range_ratio, num_prompts)
    prompt_rng = stream_rng(seed, PROMPT_STREAM)
    requests = []
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        text, actual_len = random_token_prompt(codec, prompt_rng, int(n_in))
        requests.append(SampleRequest(text, actual_len, int(n_out)))
    return requests


def synthetic_sharegpt_lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) lengths from the log-normal model above, clipped to vLLM's ShareGPT filter."""
    def lognormal(mean: float) -> np.ndarray:
        mu = math.log(mean) - SHAREGPT_LOGNORMAL_SIGMA**2 / 2  # so that E[X] == mean before clipping
        return np.rint(rng.lognormal(mu, SHAREGPT_LOGNORMAL_SIGMA, size=n)).astype(np.int64)

    inputs = np.clip(lognormal(SHAREGPT_MEAN_INPUT), SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT)
    outputs = np.clip(lognormal(SHAREGPT_MEAN_OUTPUT), SHAREGPT_MIN_LEN, SHAREGPT_MAX_TOTAL - inputs)
    return inputs, outputs


def synthetic_sharegpt_requests(codec, num_prompts: int, seed: int,
                                output_len: int | None = None) -> list[SampleRequest]:
    inputs, outputs = synthetic_sharegpt_lengths(stream_rng(seed, LENGTH_STREAM), num_prompts)
    prompt_rng = stream_rng(seed, PROMPT_STREAM)
    requests = []
    for n_in, n_out in zip(inputs, outputs, strict=True):
        text, actual_len = random_token_prompt(codec, prompt_rng, int(n_in))
        requests.append(SampleRequest(text, actual_len, int(output_len or n_out)))
    return requests


def sharegpt_requests(codec, path: str, num_prompts: int, seed: int,
                      output_len: int | None = None) -> list[SampleRequest]:
    """First human turn as the prompt, the reply's length as max_tokens; vLLM's length filter."""
    with open(path, encoding="utf-8") as f:
        conversations = [c.get("conversations") or c.get("conversation") or [] for c in json.load(f)]
    pairs = [(c[0]["value"], c[1]["value"]) for c in conversations if len(c) >= 2]
    order = stream_rng(seed, SHUFFLE_STREAM).permutation(len(pairs))
    requests = []
    for index in order:
        prompt, completion = pairs[index]
        prompt_len = len(codec.encode(prompt))
        reply_len = output_len or len(codec.encode(completion))
        if prompt_len < SHAREGPT_MIN_LEN or reply_len < SHAREGPT_MIN_LEN:
            continue
        if prompt_len > SHAREGPT_MAX_PROMPT or prompt_len + reply_len > SHAREGPT_MAX_TOTAL:
            continue
        requests.append(SampleRequest(prompt, prompt_len, reply_len))
        if len(requests) == num_prompts:
            break
    if len(requests) < num_prompts:
        raise ValueError(f"{path} holds only {len(requests)} usable conversations, {num_prompts} asked")
    return requests


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times (s from the start) of each request: gamma-distributed gaps with mean 1/rate.

    burstiness 1 is a Poisson process; below 1 burstier, above 1 more regular. rate inf sends all at once.
    The first request goes at 0.
    """
    if burstiness <= 0:
        raise ValueError("--burstiness must be > 0")
    if math.isinf(request_rate):
        return np.zeros(num_requests)
    if request_rate <= 0:
        raise ValueError("--request-rate must be > 0")
    rng = stream_rng(seed, ARRIVAL_STREAM)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if num_requests else np.zeros(0)
