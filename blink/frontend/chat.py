"""POST /v1/chat/completions: chat template -> prompt ids -> n choices, streamed or not."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.errors import APIError
from blink.frontend.generation import TokenLogprob, collect, generate, merge
from blink.frontend.prompt_logprobs import vllm_prompt_logprobs
from blink.frontend.protocol import ChatCompletionRequest, ChatMessage
from blink.frontend.serving import (
    FrontendState,
    arrival,
    now,
    request_id,
    sse_stream,
    unless_disconnected,
    usage,
)
from blink.frontend.structured import constrain, hold
from blink.frontend.text_workers import INLINE_ENCODE_CHARS
from blink.frontend.tools import ToolStream, parse_tool_calls, plan_tools
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


async def chat_prompt_ids(state: FrontendState, messages: list[ChatMessage], add_generation_prompt: bool,
                          chat_template_kwargs: dict | None, tools: list | None = None) -> list[int]:
    """Render the chat template and tokenize, both on the worker pool (one job)."""
    template = state.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise APIError(400, "messages must not be empty", "messages")
    conversation = [_message_dict(m) for m in messages]

    def render_and_encode() -> list[int]:
        try:
            text = template.render(conversation, add_generation_prompt, tools, **(chat_template_kwargs or {}))
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), "messages") from None
        state.precheck_text(text)
        # the template writes the special tokens (BOS...) itself, as transformers' apply_chat_template
        return state.tokenizer.encode_released(text, add_special_tokens=False)

    # a short plain chat (roles and text alone) is templated and tokenized on the loop: too small for the hop
    small = not tools and not chat_template_kwargs and all(m.keys() <= {"role", "content"} for m in conversation) \
        and sum(len(m["role"]) + len(m.get("content") or "") for m in conversation) <= INLINE_ENCODE_CHARS
    return await state.text.run(render_and_encode, inline=small)


def chat_logprobs(state: FrontendState, entries: list[TokenLogprob], as_ids: bool = False) -> dict:
    def item(token_id: int, logprob: float) -> dict:
        text = state.token_text(token_id, as_ids)
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
    state.check_fields(body)
    if body.store:
        raise APIError(400, "store=true is not supported: blink keeps no completions", "store")
    if body.continue_final_message:
        raise APIError(400, "continue_final_message is not supported", "continue_final_message")
    prompt_ids = await chat_prompt_ids(state, body.messages, body.add_generation_prompt,
                                       body.chat_template_kwargs, body.tools)
    state.check_prompt(prompt_ids)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    num_logprobs = _num_logprobs(body)
    params = [state.sampling_params(body, prompt_ids, max_tokens, num_logprobs, j) for j in range(body.n)]
    state.check_engine()
    template = state.tokenizer.chat_template
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, template and template.source)
    constraint = await constrain(state, body, params, tools.constraint if tools else None)
    generation = state.generation_for(body)
    streams = [hold(state, constraint, generate(generation, prompt_ids, p, body.skip_special_tokens, body.keep_stop,
                                                arrival(request)))
               for p in params]
    head = {"id": f"chatcmpl-{request_id(request)}", "created": now(), "model": state.served_model_name}
    if body.stream:
        chunks = _stream_chunks(state, body, head, streams, len(prompt_ids), tools)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    results = await unless_disconnected(request, asyncio.gather(*(collect(s) for s in streams)))
    choices = []
    for index, result in enumerate(results):
        if result.error:
            raise APIError(500, "the engine failed the request")
        logprobs = None
        if num_logprobs is not None:
            logprobs = chat_logprobs(state, result.logprobs, body.return_tokens_as_token_ids)
        message, finish = {"role": "assistant", "content": result.text}, result.finish_reason
        if tools is not None and tools.parse:
            content, calls = parse_tool_calls(result.text, tools)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls" if finish == "stop" else finish
        choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish,
                        "stop_reason": result.stop_reason})
    completion_tokens = sum(r.num_tokens for r in results)
    out = {**head, "object": "chat.completion", "choices": choices,
           "usage": usage(len(prompt_ids), completion_tokens, results[0].cached_tokens)}
    if body.prompt_logprobs is not None:  # vLLM's: one list for the (templated) prompt, beside the choices
        out["prompt_logprobs"] = vllm_prompt_logprobs(state, results[0].prompt_logprobs, body.prompt_logprobs,
                                                      body.return_tokens_as_token_ids)
    return JSONResponse(out)


async def _stream_chunks(state: FrontendState, body: ChatCompletionRequest, head: dict, streams,
                         num_prompt_tokens: int, tools=None) -> AsyncIterator[dict]:
    head = {**head, "object": "chat.completion.chunk"}
    tokens, cached = [0] * len(streams), 0

    def chunk(choice: dict) -> dict:
        out = {**head, "choices": [choice]}
        if body.continuous_usage:  # vLLM's continuous_usage_stats: usage so far in every chunk
            out["usage"] = usage(num_prompt_tokens, sum(tokens))
        return out

    parsers = [ToolStream(tools) if tools is not None and tools.parse else None for _ in streams]
    for index in range(len(streams)):
        yield chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None})
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        tokens[index] = delta.num_tokens
        if index == 0:
            cached = delta.cached_tokens
        logprobs = chat_logprobs(state, delta.logprobs, body.return_tokens_as_token_ids) if body.logprobs else None
        text, finish, calls = delta.text, delta.finish_reason, []
        if parsers[index] is not None:  # tool calls: content until a call may start, the calls at the end
            text = parsers[index].feed(text)
            if finish:
                rest, calls = parsers[index].finish()
                text += rest
                finish = "tool_calls" if calls and finish == "stop" else finish
        content = {"content": text} if text or not (finish or calls) else {}
        if calls:  # OpenAI's shape: the calls in a delta of their own, with index, id, type and function
            if content:
                yield chunk({"index": index, "delta": content, "logprobs": logprobs, "finish_reason": None})
                logprobs = None
            content = {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}
        choice = {"index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = delta.stop_reason
        yield chunk(choice)
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(num_prompt_tokens, sum(tokens), cached)}
