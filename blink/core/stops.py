"""Stop conditions checked after every sampled token (both engines use the same rules)."""
from __future__ import annotations

from blink.request import FinishReason, SamplingParams


def check_stop(params: SamplingParams, output_ids: list[int], num_tokens: int, eos_ids: tuple[int, ...],
               max_model_len: int) -> FinishReason:
    """Stop tokens (EOS unless ignore_eos, and stop_token_ids) end a request only once at least
    min_tokens tokens came before them; max_tokens and the context length end it regardless."""
    last = output_ids[-1]
    if len(output_ids) - 1 >= params.min_tokens:
        if last in params.stop_token_ids or (not params.ignore_eos and last in eos_ids):
            return FinishReason.STOP
    if len(output_ids) >= params.max_tokens or num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return FinishReason.NONE
