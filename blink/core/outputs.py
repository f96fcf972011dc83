"""The messages of one engine step, defined once: what the scheduler decides (SchedulerOutput) and what the
runner gives back for it (one SampledToken per row that samples). The scheduler's contract is vLLM v1's:
`schedule() -> SchedulerOutput`, the forward runs it, `update_from_output(output, sampled)` applies it."""
from __future__ import annotations

from dataclasses import dataclass, field

from blink.core.sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int  # first token position run this step
    num_tokens: int
    samples: bool = field(init=False)  # reaches the end of the sequence, so a token is sampled after it

    def __post_init__(self):
        self.samples = self.start + self.num_tokens == self.seq.num_tokens

    @property
    def num_prompt_rows(self) -> int:
        """Rows of prompt logprobs: positions start, start + 1, ... (Sequence.prompt_rows)."""
        return self.seq.prompt_rows(self.start, self.num_tokens)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk]  # one row of the step each, in row order
    admitted: list[Sequence]  # newly (re-)admitted this step: their sampling slots need setting
    # Filled by the runner's read-back: per chunk, its prompt logprobs (empty for most); the scheduler turns
    # them into prompt events ahead of the chunk's token.
    prompt_logprobs: list[list[PromptLogprob]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def max_top_logprobs(self) -> int:
        """The most top logprobs any row asked for (what the runner reads back)."""
        return max((c.seq.params.logprobs or 0 for c in self.chunks), default=0)


@dataclass
class PromptLogprob:
    """The logprob of prompt token `index` (>= 1) from the logits at position index - 1."""

    index: int
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]
