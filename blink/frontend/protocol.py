"""Request bodies of the OpenAI-compatible API (pydantic).

Every field is decided: declared fields are implemented (or refused with a 400 where a value is not
supported); any other field is a 400 that names it (pydantic's extra="forbid"), so nothing a client sends
is silently ignored. docs/api.md lists them. The structured-output and tool fields are declared by
StructuredFields (blink/frontend/constraint_fields.py) and ToolFields (tools.py).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from blink.frontend.constraint_fields import StructuredFields
from blink.frontend.tools import ToolFields
from blink.request import SamplingParams


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk (needs include_usage)


class SamplingFields(Strict, StructuredFields):
    """Fields shared by completions and chat (OpenAI's plus vLLM's extras)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # written to the access log
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    prompt_logprobs: int | None = None  # vLLM's: logprob, rank and top-N of every prompt token (not streamed)
    stream_interval: int | None = Field(None, ge=1)  # vLLM's: this request's --stream-interval
    # SGLang's, which vllm-router forwards on every request: no_stop_trim keeps the stop string or token
    # (as include_stop_str_in_output); return_hidden_states is accepted only false.
    no_stop_trim: bool = False
    return_hidden_states: bool = False

    def sampling_params(self, max_tokens: int, logprobs: int | None, choice_index: int,
                        prompt_logprobs: int | None = None, server_defaults: dict | None = None) -> SamplingParams:
        """Raises ValueError (one line) for values out of range; the API answers 400 with it.
        server_defaults: what an unset field takes before SamplingParams' own (sampling_defaults.py)."""
        defaults = SamplingParams.__dataclass_fields__
        seed = None if self.seed is None else self.seed + choice_index  # n choices must differ

        def pick(name):
            value = getattr(self, name)
            if value is not None:
                return value
            return (server_defaults or {}).get(name, defaults[name].default)

        try:
            logit_bias = {int(k): float(v) for k, v in (self.logit_bias or {}).items()}
        except ValueError:
            raise ValueError("logit_bias keys must be token ids") from None
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"), min_p=pick("min_p"),
            presence_penalty=pick("presence_penalty"), frequency_penalty=pick("frequency_penalty"),
            repetition_penalty=pick("repetition_penalty"), logit_bias=logit_bias, seed=seed,
            max_tokens=max_tokens, min_tokens=self.min_tokens, stop=stop,
            stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def keep_stop(self) -> bool:
        """include_stop_str_in_output (vLLM) or no_stop_trim (SGLang)."""
        return self.include_stop_str_in_output or self.no_stop_trim

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None  # only best_of == n (no ranking of extra candidates)
    add_special_tokens: bool = True


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, name, ...: passed to the template as they are
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields, ToolFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    store: bool | None = None  # false (or null) is what blink does anyway: it keeps no completions; true: 400
    continue_final_message: bool = False  # the last message left open for the model to go on (vLLM's)
    chat_template: str | None = None  # vLLM's: this request's template (--trust-request-chat-template)
    echo: bool = False  # vLLM's: the answer starts with the last message's text when it is the assistant's
    # Reasoning switches (vllm-router forwards SGLang's on every chat request); they act under
    # --reasoning-parser: separate_reasoning (SGLang) false keeps the raw text in `content`, include_reasoning
    # (vLLM) false drops the reasoning, stream_reasoning (SGLang) false sends it in one piece (chat_output.py).
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    include_reasoning: bool = True


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]
