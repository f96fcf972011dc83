"""Request-level plain data shared by every role: sampling parameters, finish reasons and token events."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

MAX_STOP_TOKEN_IDS = 16  # ring descriptors carry this many stop ids; more are refused
MAX_LOGIT_BIAS = 300  # OpenAI's own limit on logit_bias entries
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs


class FinishReason(enum.IntEnum):
    """Why a request ended; the integer is what travels on the egress ring."""

    NONE = 0
    STOP = 1  # EOS, a stop token id or (front end) a stop string
    LENGTH = 2  # max_tokens or the context limit
    ABORT = 3  # aborted by the client or the front end
    ERROR = 4  # refused by the engine (invalid descriptor, launch error)

    @property
    def openai(self) -> str | None:
        return {1: "stop", 2: "length", 3: "abort", 4: "error"}.get(int(self))


CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "reasoned")  # append only: rings carry the index


@dataclass(frozen=True)
class Constraint:
    """A structured-output constraint as text (the compiled automaton lives in blink/grammar/).

    spec: the schema's JSON text (json_schema), the regex (regex), a JSON list of strings (choice),
    "" (json_object), and for reasoned (free thought, then the inner constraint: blink/grammar/reasoning.py)
    the JSON text, keys sorted, of {"inner": {"kind", "spec"}, "open": tag, "close": tag, "starts_open": bool}.
    Frozen and hashable: it is the compile cache's key.
    """

    kind: str
    spec: str = ""

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}")


@dataclass
class SamplingParams:
    """vLLM-compatible sampling parameters. temperature == 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per token (0 = only the chosen token's)
    constraint: Constraint | None = None  # structured output: the grammar masks every sampled token
    prompt_logprobs: int | None = None  # vLLM's: logprob, rank and this many top logprobs per prompt token

    def __post_init__(self):
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        """Raise ValueError with a one-line message for anything out of range."""
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens must be in [0, max_tokens]"),
            (len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
             f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are supported"),
            (len(self.logit_bias) <= MAX_LOGIT_BIAS, f"at most {MAX_LOGIT_BIAS} logit_bias entries"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
             f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS,
             f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
            (all(-100 <= v <= 100 for v in self.logit_bias.values()), "logit_bias values must be in [-100, 100]"),
            (self.constraint is None or not self.ignore_eos,
             "ignore_eos cannot be combined with a structured output constraint (it ends at its EOS)"),
            (self.constraint is None or self.min_tokens == 0,
             "min_tokens cannot be combined with a structured output constraint"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_search(self) -> bool:
        """Whether a row with these parameters needs the sampler's threshold search (kernels/sampling.sample's
        `search`): sampled with a filter (kernels/sampling_bucket.is_filtered) or asking for top logprobs."""
        filtered = not self.greedy and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)
        return filtered or bool(self.logprobs)


@dataclass
class TokenEvent:
    """One generated token, or the end of a request (the egress record as a Python object).

    A prompt event (position < 0 with no finish, only for requests with prompt_logprobs, before their first
    token) carries prompt token -position: its id, logprob, rank and top logprobs.
    """

    req_id: int
    token_id: int  # -1 when the event only carries a finish (abort/error with no new token)
    position: int  # index of this output token: 0, 1, 2, ...; a prompt event: minus its prompt index
    finish_reason: FinishReason = FinishReason.NONE
    logprob: float = 0.0
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    queue_us: int = 0  # the first token's event: microseconds the engine queued the request (metrics)
    cached_tokens: int = 0  # prompt tokens the request found in the prefix cache at its first admission
    rank: int = 0  # a prompt event: the token's rank in the vocabulary (1 = the most likely)

    @property
    def finished(self) -> bool:
        return self.finish_reason != FinishReason.NONE

    @property
    def is_prompt(self) -> bool:
        """A prompt event (position < 0 and no finish: the front end's own ERROR events use position -1)."""
        return self.position < 0 and self.finish_reason == FinishReason.NONE


SEED_BITS = 63
_MASK64 = (1 << 64) - 1


def request_seed(params: SamplingParams, req_id: int, base_seed: int) -> int:
    """The seed a request samples with, decided in this one place for both modes: its own `seed`, else one
    derived from (base_seed, req_id). With the engine's --seed as base_seed, offline runs (host or device
    mode) are reproducible; the server's front end passes a base drawn at its start (unseeded = random)."""
    if params.seed is not None:
        return params.seed
    x = (base_seed * 0x9E3779B97F4A7C15 + req_id + 1) & _MASK64  # splitmix64 of the pair
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> (64 - SEED_BITS)
