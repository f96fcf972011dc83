"""The offline API: `blink.LLM(model=...).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from blink.config import EngineArgs
from blink.entrypoints.engine_factory import make_engine
from blink.request import FinishReason, SamplingParams
from blink.text.detokenizer import IncrementalDetokenizer, StopStringMatcher


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (vLLM's RequestOutput field)
    # SamplingParams.prompt_logprobs: None for the first prompt token, then {token id: logprob} of the
    # prompt token and the top ones (vLLM's RequestOutput.prompt_logprobs, logprobs as floats)
    prompt_logprobs: list[dict[int, float] | None] | None = None


class _Request:
    """One prompt's output as it grows: text decoded incrementally and stop strings matched on the deltas,
    with the server's pieces (blink/text/detokenizer.py), so a token costs a short decode, not a full one."""

    def __init__(self, out: RequestOutput, params: SamplingParams, tokenizer):
        self.out, self.params = out, params
        self.detok = IncrementalDetokenizer(tokenizer, out.prompt_token_ids)
        self.stops = StopStringMatcher(params.stop)

    def add(self, token_id: int, reason: FinishReason) -> bool:
        """Append an event's text (token_id -1: none); True if a stop string ended the request here."""
        piece = ""
        if token_id >= 0 and reason != FinishReason.STOP:  # a stop token (EOS or stop_token_ids) is no text
            piece = self.detok.add(token_id)
        if reason != FinishReason.NONE:
            piece += self.detok.flush()
        text, stopped = self.stops.feed(piece, check=len(self.out.token_ids) >= self.params.min_tokens)
        if reason != FinishReason.NONE and not stopped:
            text += self.stops.flush()
        self.out.text += text
        return stopped


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs):
        if model is None:  # the demo model: its directory also holds the tokenizer
            from blink.model.demo import ensure_default_model

            model = str(ensure_default_model())
        self.args = EngineArgs(model=model, **engine_kwargs)
        self.engine = make_engine(self.args)
        from blink.text.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(self.args.tokenizer or self.args.model)
        self._ids = itertools.count(1)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Submit all prompts together (they are batched) and return one output per prompt, in order.
        A prompt is a string or a list of token ids."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        requests: dict[int, _Request] = {}
        for prompt, p in zip(prompts, params, strict=True):
            ids = list(prompt) if not isinstance(prompt, str) else self.tokenizer.encode(prompt)
            req_id = next(self._ids)
            self.engine.add_request(req_id, ids, p)
            out = RequestOutput(prompt if isinstance(prompt, str) else None, ids)
            if p.prompt_logprobs is not None:
                out.prompt_logprobs = [None] * len(ids)
            requests[req_id] = _Request(out, p, self.tokenizer)
        live = set(requests)
        while live:
            for ev in self.engine.step():
                if ev.req_id not in live:
                    continue
                r = requests[ev.req_id]
                if ev.is_prompt:  # before its first token (a recomputed prefill may resend one)
                    r.out.prompt_logprobs[-ev.position] = {ev.token_id: ev.logprob,
                                                           **dict(zip(ev.top_ids, ev.top_logprobs, strict=True))}
                    continue
                reason = ev.finish_reason
                r.out.num_cached_tokens = max(r.out.num_cached_tokens, ev.cached_tokens)
                if ev.token_id >= 0:
                    r.out.token_ids.append(ev.token_id)
                    r.out.logprobs.append(ev.logprob)
                    if r.params.logprobs:
                        r.out.top_logprobs.append(dict(zip(ev.top_ids, ev.top_logprobs, strict=True)))
                if r.add(ev.token_id, reason):
                    if reason == FinishReason.NONE:
                        self.engine.abort_request(ev.req_id)  # frees its blocks now; its abort event is skipped
                    reason = FinishReason.STOP
                if reason != FinishReason.NONE:
                    r.out.finish_reason = reason.openai
                    live.discard(ev.req_id)
        return [r.out for r in requests.values()]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block, as vLLM's LLM.reset_prefix_cache (False: the cache is off)."""
        return self.engine.reset_prefix_cache()
