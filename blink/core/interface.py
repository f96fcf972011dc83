"""The engine interface that host mode and device mode both implement (their events are blink.request.TokenEvent)."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import NamedTuple

from blink.core.limits import EngineLimits
from blink.request import SamplingParams, TokenEvent


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    free_kv_blocks: int = 0
    total_kv_blocks: int = 0
    steps: int = 0
    tokens: int = 0
    preemptions: int = 0
    iteration_tokens: tuple[int, ...] = ()  # steps per size bucket (layout.ITERATION_TOKEN_BOUNDS, then more)
    iteration_tokens_sum: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache at admissions
    prefix_cache_hits: int = 0  # of those, found cached


class StepTime(NamedTuple):
    """One engine step as rank 0 saw it: wall seconds from scheduling to the sampled tokens being back."""

    seconds: float
    num_tokens: int  # tokens in the step (prefill chunks and decodes)
    num_seqs: int  # sequences in the step; num_tokens == num_seqs for a pure decode step


class Engine(abc.ABC):
    """What the front end, the offline LLM and the tests need from an engine."""

    limits: EngineLimits  # resolved once at load (blink/core/limits.py)
    paced: bool = False  # the last step() only waited out the decode pace: no step ran (blink/host/pace.py)

    @abc.abstractmethod
    def add_request(self, req_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request. Raises ValueError (one-line message) for a request it cannot serve."""

    @abc.abstractmethod
    def abort_request(self, req_id: int) -> None:
        """Stop a waiting or running request and free its KV blocks; emits a finish event (ABORT)."""

    @abc.abstractmethod
    def step(self) -> list[TokenEvent]:
        """Advance: host mode runs one scheduler step; device mode drains what the GPU produced."""

    @abc.abstractmethod
    def has_unfinished(self) -> bool: ...

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (POST /reset_prefix_cache); False when prefix caching is off."""
        return False

    def shutdown(self) -> None:  # noqa: B027 - optional
        pass
