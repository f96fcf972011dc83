"""The engine's limits, resolved once from the arguments and the model config and handed to every consumer
(scheduler, runner, device loop, front end through the control block) instead of re-derived by each."""
from __future__ import annotations

from dataclasses import dataclass

MAX_DEFAULT_MODEL_LEN = 8192  # --max-model-len left out: the model's max_position_embeddings, capped here


def default_max_model_len(max_position_embeddings: int) -> int:
    return min(max_position_embeddings, MAX_DEFAULT_MODEL_LEN)


def make_buckets(max_tokens: int, max_seqs: int) -> tuple[tuple[int, int], ...]:
    """(tokens, sequences) per captured graph: powers of two up to the token budget."""
    sizes, t = [], 1
    while t < max_tokens:
        sizes.append(t)
        t *= 2
    sizes.append(max_tokens)
    return tuple((t, min(t, max_seqs)) for t in sizes)


@dataclass(frozen=True)
class EngineLimits:
    max_model_len: int  # prompt + output tokens of one request
    max_num_seqs: int  # rows in one step (and sampling slots)
    max_num_batched_tokens: int  # tokens in one step: the largest bucket
    block_size: int  # tokens per KV block
    num_kv_blocks: int  # the KV pool (the smallest any tensor-parallel rank holds)
    vocab_size: int  # valid token ids are [0, vocab_size)
    enable_prefix_caching: bool = False  # share the KV blocks of cached prompt prefixes (prefix_cache.py)
    prompt_logprob_rows: int = 0  # prompt positions per step whose logprobs are computed; 0 = refused

    @classmethod
    def resolve(cls, args, max_position_embeddings: int, vocab_size: int, num_kv_blocks: int) -> EngineLimits:
        """args: EngineArgs. Raises ValueError (one line) for limits the model cannot honour."""
        max_len = args.max_model_len or default_max_model_len(max_position_embeddings)
        if max_len > max_position_embeddings:
            raise ValueError(f"--max-model-len {max_len} exceeds the model's {max_position_embeddings}")
        # A step must hold at least one token per running sequence.
        budget = max(args.max_num_batched_tokens, args.max_num_seqs)
        return cls(max_len, args.max_num_seqs, budget, args.block_size, num_kv_blocks, vocab_size,
                   args.enable_prefix_caching, prompt_logprob_rows(args, budget))

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        return make_buckets(self.max_num_batched_tokens, self.max_num_seqs)

    @property
    def num_kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


def prompt_logprob_rows(args, budget: int) -> int:
    """Rows per step for prompt logprobs. Not under tensor parallelism for now: the rows' logits would be
    all-gathered whole (docs/roadmap.md), so it gets 0 and the front end refuses such requests."""
    if args.max_prompt_logprob_rows < 0:
        raise ValueError("--max-prompt-logprob-rows must be >= 0")
    if args.tensor_parallel_size > 1:
        return 0
    return min(args.max_prompt_logprob_rows, budget)


def publish_limits(limits: EngineLimits, control) -> None:
    """Write the limits into the segment's control block (blink/transport/layout.py), before `ready`: the
    front end reads them there instead of re-deriving them."""
    buckets = limits.buckets
    control.max_model_len, control.max_num_seqs = limits.max_model_len, limits.max_num_seqs
    control.max_num_batched_tokens, control.block_size = limits.max_num_batched_tokens, limits.block_size
    control.num_kv_blocks, control.vocab_size = limits.num_kv_blocks, limits.vocab_size
    control.prefix_caching = int(limits.enable_prefix_caching)
    control.prompt_logprob_rows = limits.prompt_logprob_rows
    control.num_buckets = min(len(buckets), len(control.bucket_tokens))
    for i, (tokens, _) in enumerate(buckets[: control.num_buckets]):
        control.bucket_tokens[i] = tokens
