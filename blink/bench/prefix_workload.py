"""Workloads that exercise the prefix cache: a shared prefix with unique suffixes (vLLM's
--random-prefix-len) and a multi-turn chat whose every turn resends the conversation so far.

Both are built from random-token text (workload.random_token_prompt), seeded. A prompt's length is
re-measured after joining its parts: the tokenizer may merge tokens across a join.
"""
from __future__ import annotations

from blink.bench.workload import (
    LENGTH_STREAM,
    PROMPT_STREAM,
    SampleRequest,
    random_token_prompt,
    sample_lengths,
    stream_rng,
)

PREFIX_STREAM = 5  # the shared prefix's own stream: changing the suffixes leaves it unchanged


def shared_prefix(codec, seed: int, prefix_len: int) -> str:
    return random_token_prompt(codec, stream_rng(seed, PREFIX_STREAM), prefix_len)[0] if prefix_len else ""


def prefix_requests(codec, num_prompts: int, prefix_len: int, input_len: int, output_len: int,
                    range_ratio: float, seed: int) -> list[SampleRequest]:
    """Every prompt: the same `prefix_len` random tokens, then its own ~`input_len` random tokens."""
    prefix = shared_prefix(codec, seed, prefix_len)
    length_rng = stream_rng(seed, LENGTH_STREAM)
    suffix_lens = sample_lengths(length_rng, input_len, range_ratio, num_prompts)
    output_lens = sample_lengths(length_rng, output_len, range_ratio, num_prompts)
    prompt_rng = stream_rng(seed, PROMPT_STREAM)
    requests = []
    for n_in, n_out in zip(suffix_lens, output_lens, strict=True):
        suffix, _ = random_token_prompt(codec, prompt_rng, int(n_in))
        text = prefix + suffix
        requests.append(SampleRequest(text, len(codec.encode(text)), int(n_out)))
    return requests


def multi_turn_requests(codec, num_prompts: int, turns: int, prefix_len: int, input_len: int, output_len: int,
                        seed: int) -> list[SampleRequest]:
    """Conversations of `turns` turns after a shared system prompt of `prefix_len` tokens: turn k sends
    the system prompt, the earlier turns' user messages and replies (drawn here, `output_len` tokens each,
    standing in for the model's answers) and a new ~`input_len`-token message. Ordered turn by turn
    (every conversation's turn 0, then turn 1, ...), so a turn is usually sent after its predecessor
    finished; pace with --max-concurrency for that to hold."""
    if turns < 1:
        raise ValueError("--multi-turn-turns must be >= 1")
    system = shared_prefix(codec, seed, prefix_len)
    num_conversations = -(-num_prompts // turns)
    rng = stream_rng(seed, PROMPT_STREAM)
    histories = [system] * num_conversations
    requests: list[SampleRequest] = []
    for _ in range(turns):
        for c in range(num_conversations):
            message, _ = random_token_prompt(codec, rng, input_len)
            text = histories[c] + message
            requests.append(SampleRequest(text, len(codec.encode(text)), output_len))
            reply, _ = random_token_prompt(codec, rng, output_len)
            histories[c] = text + reply
            if len(requests) == num_prompts:
                return requests
    return requests
