"""POST /v1/chat/completions: chat template -> prompt ids -> n choices, streamed or not."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.errors import APIError
from blink.frontend.generation import TokenLogprob, collect, generate, merge
from blink.frontend.protocol import ChatCompletionRequest, ChatMessage
from blink.frontend.serving import FrontendState, new_id, now, sse_stream, unless_disconnected, usage
from blink.request import MAX_TOP_LOGPROBS


def _message_dict(message: ChatMessage) -> dict:
    out = message.model_dump(exclude_none=True)
    content = message.content
    if isinstance(content, list):  # content parts: only text is understood
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"unsupported content part type {part.get('type')!r}", "messages")
            texts.append(part["text"])
        content = "\n".join(texts)
    out["content"] = content
    return out


def chat_prompt_ids(state: FrontendState, messages: list[ChatMessage], add_generation_prompt: bool,
                    chat_template_kwargs: dict | None, tools: list | None = None) -> list[int]:
    template = state.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise APIError(400, "messages must not be empty", "messages")
    try:
        text = template.render([_message_dict(m) for m in messages], add_generation_prompt, tools,
                               **(chat_template_kwargs or {}))
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), "messages") from None
    # the template writes the special tokens (BOS...) itself, as transformers' apply_chat_template
    return state.tokenizer.encode(text, add_special_tokens=False)


def chat_logprobs(state: FrontendState, entries: list[TokenLogprob]) -> dict:
    def item(token_id: int, logprob: float) -> dict:
        text = state.tokenizer.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}


def _num_logprobs(body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
    if not body.logprobs:
        if body.top_logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        return None
    return body.top_logprobs or 0


async def create_chat_completion(state: FrontendState, body: ChatCompletionRequest, request: Request):
    state.check_model(body.model)
    prompt_ids = chat_prompt_ids(state, body.messages, body.add_generation_prompt, body.chat_template_kwargs,
                                 body.tools)
    state.check_prompt(prompt_ids)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    num_logprobs = _num_logprobs(body)
    params = [state.sampling_params(body, prompt_ids, max_tokens, num_logprobs, j) for j in range(body.n)]
    state.check_engine()
    streams = [generate(state.generation, prompt_ids, p, body.skip_special_tokens) for p in params]
    head = {"id": new_id("chatcmpl"), "created": now(), "model": state.served_model_name}
    if body.stream:
        chunks = _stream_chunks(state, body, head, streams, len(prompt_ids))
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    results = await unless_disconnected(request, asyncio.gather(*(collect(s) for s in streams)))
    choices = []
    for index, result in enumerate(results):
        if result.error:
            raise APIError(500, "the engine failed the request")
        logprobs = chat_logprobs(state, result.logprobs) if num_logprobs is not None else None
        choices.append({"index": index, "message": {"role": "assistant", "content": result.text},
                        "logprobs": logprobs, "finish_reason": result.finish_reason})
    completion_tokens = sum(r.num_tokens for r in results)
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": usage(len(prompt_ids), completion_tokens, results[0].cached_tokens)})


async def _stream_chunks(state: FrontendState, body: ChatCompletionRequest, head: dict, streams,
                         num_prompt_tokens: int) -> AsyncIterator[dict]:
    head = {**head, "object": "chat.completion.chunk"}
    tokens, cached = [0] * len(streams), 0
    for index in range(len(streams)):
        yield {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        tokens[index] = delta.num_tokens
        if index == 0:
            cached = delta.cached_tokens
        logprobs = chat_logprobs(state, delta.logprobs) if body.logprobs else None
        content = {"content": delta.text} if delta.text or not delta.finish_reason else {}
        yield {**head, "choices": [{"index": index, "delta": content, "logprobs": logprobs,
                                    "finish_reason": delta.finish_reason}]}
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(num_prompt_tokens, sum(tokens), cached)}
