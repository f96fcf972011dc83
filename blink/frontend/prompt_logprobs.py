"""Prompt logprobs in the API's two shapes: vLLM's `prompt_logprobs` list and the legacy completions
logprobs object of an echoed prompt (OpenAI's echo + logprobs). The engine computes them on the GPU and
sends one prompt record per prompt token after the first (blink/transport/layout.py)."""
from __future__ import annotations

from dataclasses import dataclass

from blink.frontend.errors import APIError
from blink.request import MAX_TOP_LOGPROBS


@dataclass
class PromptLogprobEntry:
    """Prompt token i (>= 1): its logprob given tokens 0..i-1, its rank, the top (id, logprob) pairs."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


def check_prompt_logprobs(state, value: int, param: str) -> None:
    """400 (naming `param`) unless the engine computes prompt logprobs and `value` is in range."""
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{param} must be in [0, {MAX_TOP_LOGPROBS}]", param)
    try:
        rows = state.client.limits().prompt_logprob_rows
    except Exception:  # noqa: BLE001 - the engine is not up: its check_engine answers 503 later
        return
    if rows == 0:
        raise APIError(400, f"{param}: prompt logprobs are not computed by this engine (tensor parallelism does "
                            "not compute them yet; otherwise it needs --max-prompt-logprob-rows > 0)", param)


def vllm_prompt_logprobs(state, entries: list[PromptLogprobEntry], k: int, as_ids: bool = False) -> list:
    """vLLM's shape: None for the first token, then {token_id: {logprob, rank, decoded_token}}, the prompt
    token first, then the top ones (ranks 1, 2, ...)."""
    out: list = [None]
    for e in entries:
        item = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank,
                                  "decoded_token": state.token_text(e.token_id, as_ids)}}
        for j, (t, lp) in enumerate(e.top[:k]):
            item.setdefault(str(t), {"logprob": lp, "rank": j + 1, "decoded_token": state.token_text(t, as_ids)})
        out.append(item)
    return out


def echo_logprobs(state, prompt_ids: list[int], entries: list[PromptLogprobEntry], k: int,
                  as_ids: bool = False) -> dict:
    """The legacy logprobs object of the echoed prompt: the first token has no logprob (None), as OpenAI;
    top_logprobs hold the prompt token too, as for generated tokens."""
    tokens, offsets, offset = [], [], 0
    for t in prompt_ids:
        tokens.append(state.token_text(t, as_ids))
        offsets.append(offset)
        offset += len(state.tokenizer.token_text(t))
    tops: list = [None]
    for e, text in zip(entries, tokens[1:], strict=True):
        top = {state.token_text(t, as_ids): lp for t, lp in e.top[:k]}
        top.setdefault(text, e.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [None] + [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def join_logprobs(first: dict, second: dict) -> dict:
    """Two legacy logprobs objects one after the other (the echoed prompt's, then the completion's)."""
    return {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
