"""POST /v1/completions: prompts (text, texts, token ids), n choices each, streamed or not."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.errors import APIError
from blink.frontend.generation import Delta, TokenLogprob, collect, generate, merge
from blink.frontend.protocol import CompletionRequest
from blink.frontend.serving import FrontendState, new_id, now, sse_stream, unless_disconnected, usage


def prompt_token_lists(state: FrontendState, prompt) -> list[list[int]]:
    """The request's prompts as token ids: a string, a list of strings, a list of ids, or lists of ids."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    else:
        prompts = prompt if not isinstance(prompt[0], int) else [prompt]
    out = []
    for item in prompts:
        ids = state.tokenizer.encode(item) if isinstance(item, str) else list(item)
        state.check_prompt(ids)
        out.append(ids)
    return out


def completion_logprobs(state: FrontendState, entries: list[TokenLogprob], text_start: int) -> dict:
    """OpenAI's legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset."""
    text = state.tokenizer.token_text
    tokens, offsets, offset = [], [], text_start
    for entry in entries:
        tokens.append(text(entry.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{text(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


async def create_completion(state: FrontendState, body: CompletionRequest, request: Request):
    state.check_model(body.model)
    if body.suffix:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo together with logprobs is not supported (no prompt logprobs)", "echo")
    prompts = prompt_token_lists(state, body.prompt)
    params = [[state.sampling_params(body, ids, body.max_tokens, body.logprobs, j) for j in range(body.n)]
              for ids in prompts]
    state.check_engine()
    echo = [state.tokenizer.decode(ids) if body.echo else "" for ids in prompts]
    streams = [generate(state.generation, ids, p, body.skip_special_tokens)
               for ids, choice_params in zip(prompts, params, strict=True) for p in choice_params]
    num_prompt_tokens = sum(len(ids) for ids in prompts)
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": now(),
            "model": state.served_model_name}
    if body.stream:
        chunks = _stream_chunks(state, body, head, streams, echo, num_prompt_tokens)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    results: list[Delta] = await unless_disconnected(request, _collect_all(streams))
    choices = []
    for index, result in enumerate(results):
        if result.error:
            raise APIError(500, "the engine failed the request")
        prefix = echo[index // body.n]
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(state, result.logprobs, len(prefix))
        choices.append({"index": index, "text": prefix + result.text, "logprobs": logprobs,
                        "finish_reason": result.finish_reason})
    completion_tokens = sum(r.num_tokens for r in results)
    cached = sum(r.cached_tokens for r in results[::body.n])  # each prompt once: its first choice's hit
    return JSONResponse({**head, "choices": choices, "usage": usage(num_prompt_tokens, completion_tokens, cached)})


async def _collect_all(streams) -> list[Delta]:
    return list(await asyncio.gather(*(collect(s) for s in streams)))


async def _stream_chunks(state: FrontendState, body: CompletionRequest, head: dict, streams, echo: list[str],
                         num_prompt_tokens: int) -> AsyncIterator[dict]:
    tokens, cached = [0] * len(streams), [0] * len(streams)
    offsets = [len(echo[i // body.n]) for i in range(len(streams))]
    if body.echo:
        for index in range(len(streams)):
            yield {**head, "choices": [{"index": index, "text": echo[index // body.n], "logprobs": None,
                                        "finish_reason": None}]}
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        tokens[index], cached[index] = delta.num_tokens, delta.cached_tokens
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(state, delta.logprobs, offsets[index])
        offsets[index] += len(delta.text)
        yield {**head, "choices": [{"index": index, "text": delta.text, "logprobs": logprobs,
                                    "finish_reason": delta.finish_reason}]}
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(num_prompt_tokens, sum(tokens), sum(cached[::body.n]))}
