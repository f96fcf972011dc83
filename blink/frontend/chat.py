"""POST /v1/chat/completions: chat template -> prompt ids -> n choices, streamed or not."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.chat_output import ChoiceStream, ReasoningPlan, assistant_message, reasoning_fields
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
from blink.frontend.tools import plan_tools
from blink.request import MAX_TOP_LOGPROBS
from blink.text.chat_template import compiled_template
from blink.text.reasoning import OPEN


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
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_call_with_object_arguments(call) for call in out["tool_calls"]]
    return out


def _call_with_object_arguments(call):
    """OpenAI's clients send a call's arguments as a JSON string; templates expect the object (Llama 3's
    `arguments | tojson` would quote the string again, Qwen3-Coder's iterates its items), as vLLM passes it."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        arguments = json.loads(fn["arguments"])
    except json.JSONDecodeError as e:
        raise APIError(400, f"a tool call's function.arguments is not JSON: {e}", "messages") from None
    return {**call, "function": {**fn, "arguments": arguments}}


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    thought: str = ""  # under --reasoning-parser: where the prompt leaves the thought (ReasoningFormat.thought_at)


async def chat_prompt(state: FrontendState, messages: list[ChatMessage], add_generation_prompt: bool,
                      chat_template_kwargs: dict | None, tools: list | None = None,
                      continue_final_message: bool = False, chat_template: str | None = None) -> ChatPrompt:
    """Render the chat template and tokenize, both on the worker pool (one job).
    chat_template: the request's own (vLLM's field), only under --trust-request-chat-template."""
    template = state.tokenizer.chat_template
    if chat_template is not None:
        if not state.trust_request_chat_template:
            raise APIError(400, "chat_template in a request needs the server's --trust-request-chat-template",
                           "chat_template")
    elif template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise APIError(400, "messages must not be empty", "messages")
    if continue_final_message and add_generation_prompt:  # as vLLM: the two ask for opposite prompts
        raise APIError(400, "continue_final_message needs add_generation_prompt=false", "continue_final_message")
    conversation = [_message_dict(m) for m in messages]
    # --default-chat-template-kwargs (vLLM's) under the request's own, key by key
    chat_template_kwargs = {**state.chat_template_kwargs, **(chat_template_kwargs or {})}

    def render_and_encode() -> ChatPrompt:
        try:
            use = template if chat_template is None else \
                compiled_template(chat_template, tuple(sorted(template.special_tokens.items())) if template else ())
        except ValueError as e:  # a syntax error
            raise APIError(400, str(e), "chat_template") from None
        try:
            text = use.render(conversation, add_generation_prompt, tools, continue_final_message,
                              **chat_template_kwargs)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), "messages") from None
        state.precheck_text(text)
        # the template writes the special tokens (BOS...) itself, as transformers' apply_chat_template
        ids = state.tokenizer.encode_released(text, add_special_tokens=False)
        return ChatPrompt(ids, state.reasoning.thought_at(text) if state.reasoning else "")

    # a short plain chat (roles and text alone) is templated and tokenized on the loop: too small for the hop
    small = not tools and not chat_template_kwargs and chat_template is None \
        and all(m.keys() <= {"role", "content"} for m in conversation) \
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


def after_thinking(state: FrontendState, prompt: ChatPrompt):
    """A reasoning model thinks first: a grammar (a response format, a forced tool call) starts after its
    block (structured.constrain's `wrap`); None without --reasoning-parser."""
    if state.reasoning is None:
        return None
    return lambda c: state.reasoning.constrain(c, prompt.thought)


def _echo(body: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text, when it is the assistant's (the answer continues it)."""
    last = body.messages[-1] if body.echo and body.messages else None
    if last is None or last.role != "assistant":
        return ""
    return _message_dict(last)["content"] or ""


def _reasoning_plan(state: FrontendState, body: ChatCompletionRequest, prompt: ChatPrompt) -> ReasoningPlan | None:
    if state.reasoning is None or not body.separate_reasoning:  # SGLang's switch: false keeps the raw text
        return None
    return ReasoningPlan(state.reasoning, prompt.thought == OPEN, body.include_reasoning, body.stream_reasoning)


async def create_chat_completion(state: FrontendState, body: ChatCompletionRequest, request: Request):
    state.check_model(body.model)
    state.check_fields(body)
    if body.store:
        raise APIError(400, "store=true is not supported: blink keeps no completions", "store")
    prompt = await chat_prompt(state, body.messages, body.add_generation_prompt, body.chat_template_kwargs,
                               body.tools, body.continue_final_message, body.chat_template)
    prompt_ids = prompt.ids
    state.check_prompt(prompt_ids)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    num_logprobs = _num_logprobs(body)
    params = [state.sampling_params(body, prompt_ids, max_tokens, num_logprobs, j) for j in range(body.n)]
    state.check_engine()
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, state.tool_format(body.chat_template))
    reasoning = _reasoning_plan(state, body, prompt)
    constraint = await constrain(state, body, params, tools.constraint if tools else None,
                                 after_thinking(state, prompt))
    generation = state.generation_for(body)
    streams = [hold(state, constraint, generate(generation, prompt_ids, p, body.skip_special_tokens, body.keep_stop,
                                                arrival(request)))
               for p in params]
    head = {"id": f"chatcmpl-{request_id(request)}", "created": now(), "model": state.served_model_name}
    echo = _echo(body)
    if body.stream:
        chunks = _stream_chunks(state, body, head, streams, len(prompt_ids), tools, reasoning, echo)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    results = await unless_disconnected(request, asyncio.gather(*(collect(s) for s in streams)))
    choices = []
    for index, result in enumerate(results):
        if result.error:
            raise APIError(500, "the engine failed the request")
        logprobs = None
        if num_logprobs is not None:
            logprobs = chat_logprobs(state, result.logprobs, body.return_tokens_as_token_ids)
        message, finish = assistant_message(result.text, result.finish_reason, reasoning, tools)
        if echo:
            message["content"] = echo + (message["content"] or "")
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
                         num_prompt_tokens: int, tools=None, reasoning: ReasoningPlan | None = None,
                         echo: str = "") -> AsyncIterator[dict]:
    head = {**head, "object": "chat.completion.chunk"}
    tokens, cached = [0] * len(streams), 0

    def chunk(choice: dict) -> dict:
        out = {**head, "choices": [choice]}
        if body.continuous_usage:  # vLLM's continuous_usage_stats: usage so far in every chunk
            out["usage"] = usage(num_prompt_tokens, sum(tokens))
        return out

    outputs = [ChoiceStream(reasoning, tools) for _ in streams]
    for index in range(len(streams)):
        yield chunk({"index": index, "delta": {"role": "assistant", "content": echo}, "logprobs": None,
                     "finish_reason": None})
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        tokens[index] = delta.num_tokens
        if index == 0:
            cached = delta.cached_tokens
        logprobs = chat_logprobs(state, delta.logprobs, body.return_tokens_as_token_ids) if body.logprobs else None
        output, finish = outputs[index], delta.finish_reason
        # reasoning, then content until a tool call may start, the calls as written (forced) or at the end
        piece = output.finish(delta.text) if finish else output.feed(delta.text)
        if finish == "stop" and output.used_tools:
            finish = "tool_calls"
        content = {"content": piece.content} if piece.content or not (finish or piece.calls or piece.thought) else {}
        if piece.thought:
            content = {**reasoning_fields(piece.thought), **content}
        if piece.calls:  # OpenAI's shape: the calls in a delta of their own (index, then id, type, function)
            if content:
                yield chunk({"index": index, "delta": content, "logprobs": logprobs, "finish_reason": None})
                logprobs = None
            content = {"tool_calls": piece.calls}
        choice = {"index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = delta.stop_reason
        yield chunk(choice)
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(num_prompt_tokens, sum(tokens), cached)}
