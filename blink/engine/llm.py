"""The offline API: `blink.LLM(model=...).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from blink.config import EngineArgs
from blink.engine.factory import make_engine
from blink.request import FinishReason, SamplingParams


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs):
        if model is None:  # the demo model: its directory also holds the tokenizer
            from blink.model.demo import ensure_default_model

            model = str(ensure_default_model())
        self.args = EngineArgs(model=model, **engine_kwargs)
        self.engine = make_engine(self.args)
        from blink.frontend.tokenizer import load_tokenizer

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
        outs: dict[int, tuple[RequestOutput, SamplingParams]] = {}
        for prompt, p in zip(prompts, params, strict=True):
            ids = list(prompt) if not isinstance(prompt, str) else self.tokenizer.encode(prompt)
            req_id = next(self._ids)
            self.engine.add_request(req_id, ids, p)
            outs[req_id] = (RequestOutput(prompt if isinstance(prompt, str) else None, ids), p)
        live = set(outs)
        while live:
            for ev in self.engine.step():
                if ev.req_id not in live:
                    continue
                out, p = outs[ev.req_id]
                if ev.token_id >= 0:
                    out.token_ids.append(ev.token_id)
                    out.logprobs.append(ev.logprob)
                    if p.logprobs:
                        out.top_logprobs.append(dict(zip(ev.top_ids, ev.top_logprobs, strict=True)))
                reason = ev.finish_reason
                if reason == FinishReason.NONE and p.stop and self._hit_stop_string(out, p):
                    self.engine.abort_request(ev.req_id)  # frees its blocks now; its abort event is skipped
                    reason = FinishReason.STOP
                if reason != FinishReason.NONE:
                    if out.finish_reason is None:
                        out.finish_reason = reason.openai
                    if not out.text:
                        out.text = self._decode(out.token_ids, p)
                    live.discard(ev.req_id)
        return [o for o, _ in outs.values()]

    def _decode(self, ids: list[int], p: SamplingParams) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(ids)
        cut = [text.find(s) for s in p.stop if s in text]
        return text[: min(cut)] if cut else text

    def _hit_stop_string(self, out: RequestOutput, p: SamplingParams) -> bool:
        if self.tokenizer is None:
            return False
        text = self.tokenizer.decode(out.token_ids)
        if any(s in text for s in p.stop):
            out.text = self._decode(out.token_ids, p)
            return True
        return False
