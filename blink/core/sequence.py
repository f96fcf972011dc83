"""A request as the host-mode scheduler sees it: its tokens, KV blocks and progress."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from blink.request import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


@dataclass
class Sequence:
    req_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # always set: the counter-based sampler needs one (drawn at submission when unseeded)
    arrival: int  # FCFS order
    output_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    slot: int = -1  # sampling-state slot while running
    status: SeqStatus = SeqStatus.WAITING
    arrived_at: float = 0.0  # perf_counter at add_request
    queue_us: int = -1  # microseconds from arrival to first admission; -1 until admitted (metrics)
    # Prefix caching (blink/core/prefix_cache.py): blocks indexed or matched so far, the chain state after
    # the last of them and the (block, gen) its next block records as parent; the first admission's hit, in tokens.
    num_hashed: int = 0
    chain_hash: int = 0
    chain_parent: tuple[int, int] = (-1, 0)
    num_cached_tokens: int = -1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed

    @property
    def is_decode(self) -> bool:
        return self.remaining == 1 and bool(self.output_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Its prompt positions need logits rows (prompt_logprobs) until its first token is out."""
        return self.params.prompt_logprobs is not None and not self.output_ids

    def prompt_rows(self, start: int, num_tokens: int) -> int:
        """Prompt-logprob rows a chunk [start, start + num_tokens) needs: positions p with a prompt token
        at p + 1 (the last prompt position predicts the first output token, not a prompt token)."""
        if not self.wants_prompt_logprobs:
            return 0
        return max(0, min(num_tokens, len(self.prompt_ids) - 1 - start))

    def token_at(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        """Token ids [start, end) of prompt + output."""
        n = len(self.prompt_ids)
        if end <= n:
            return tuple(self.prompt_ids[start:end])
        return tuple(self.prompt_ids[start:n] + self.output_ids[max(0, start - n):end - n])
