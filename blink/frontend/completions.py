"""POST /v1/completions: prompts (text, texts, token ids), n choices each, streamed or not."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.errors import APIError
from blink.frontend.generation import Delta, TokenLogprob, collect, generate, merge
from blink.frontend.protocol import CompletionRequest
from blink.frontend.serving import FrontendState, now, request_id, sse_stream, unless_disconnected, usage
from blink.frontend.structured import constrain, hold


async def prompt_token_lists(state: FrontendState, prompt, add_special_tokens: bool = True) -> list[list[int]]:
    """The request's prompts as token ids: a string, a list of strings, a list of ids, or lists of ids."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    else:
        prompts = prompt if not isinstance(prompt[0], int) else [prompt]
    for item in prompts:  # every text is pre-checked before any is tokenized
        if isinstance(item, str):
            state.precheck_text(item)
    out = []
    for item in prompts:
        if isinstance(item, str):
            out.append(await state.encode_prompt(item, add_special_tokens))
        else:
            state.check_prompt(list(item))
            out.append(list(item))
    return out


def completion_logprobs(state: FrontendState, entries: list[TokenLogprob], text_start: int,
                        as_ids: bool = False) -> dict:
    """OpenAI's legacy logprobs object. top_logprobs holds the sampled token too, as OpenAI and vLLM do."""
    tokens, offsets, tops, offset = [], [], [], text_start
    for entry in entries:
        tokens.append(state.token_text(entry.token_id, as_ids))
        offsets.append(offset)
        offset += len(state.tokenizer.token_text(entry.token_id))
        top = {state.token_text(t, as_ids): lp for t, lp in entry.top}
        top.setdefault(tokens[-1], entry.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def _check_request(body: CompletionRequest) -> None:
    if body.suffix:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo together with logprobs is not supported yet (no prompt logprobs)", "echo")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, f"best_of must equal n ({body.n}): ranking extra candidates is not supported",
                       "best_of")


async def create_completion(state: FrontendState, body: CompletionRequest, request: Request):
    state.check_model(body.model)
    state.check_fields(body)
    _check_request(body)
    prompts = await prompt_token_lists(state, body.prompt, body.add_special_tokens)
    params = [[state.sampling_params(body, ids, body.max_tokens, body.logprobs, j) for j in range(body.n)]
              for ids in prompts]
    state.check_engine()
    echo = [await state.text.decode(ids) if body.echo else "" for ids in prompts]
    constraint = await constrain(state, body, [p for choice_params in params for p in choice_params])
    streams = [hold(state, constraint, generate(state.generation, ids, p, body.skip_special_tokens, body.keep_stop))
               for ids, choice_params in zip(prompts, params, strict=True) for p in choice_params]
    num_prompt_tokens = sum(len(ids) for ids in prompts)
    head = {"id": f"cmpl-{request_id(request)}", "object": "text_completion", "created": now(),
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
            logprobs = completion_logprobs(state, result.logprobs, len(prefix), body.return_tokens_as_token_ids)
        choices.append({"index": index, "text": prefix + result.text, "logprobs": logprobs,
                        "finish_reason": result.finish_reason, "stop_reason": result.stop_reason})
    completion_tokens = sum(r.num_tokens for r in results)
    cached = sum(r.cached_tokens for r in results[::body.n])  # each prompt once: its first choice's hit
    return JSONResponse({**head, "choices": choices, "usage": usage(num_prompt_tokens, completion_tokens, cached)})


async def _collect_all(streams) -> list[Delta]:
    return list(await asyncio.gather(*(collect(s) for s in streams)))


async def _stream_chunks(state: FrontendState, body: CompletionRequest, head: dict, streams, echo: list[str],
                         num_prompt_tokens: int) -> AsyncIterator[dict]:
    tokens, cached = [0] * len(streams), [0] * len(streams)
    offsets = [len(echo[i // body.n]) for i in range(len(streams))]

    def chunk(choice: dict) -> dict:
        out = {**head, "choices": [choice]}
        if body.continuous_usage:  # vLLM's continuous_usage_stats: usage so far in every chunk
            out["usage"] = usage(num_prompt_tokens, sum(tokens))
        return out

    if body.echo:
        for index in range(len(streams)):
            yield chunk({"index": index, "text": echo[index // body.n], "logprobs": None, "finish_reason": None})
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        tokens[index], cached[index] = delta.num_tokens, delta.cached_tokens
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(state, delta.logprobs, offsets[index], body.return_tokens_as_token_ids)
        offsets[index] += len(delta.text)
        choice = {"index": index, "text": delta.text, "logprobs": logprobs, "finish_reason": delta.finish_reason}
        if delta.finish_reason is not None:
            choice["stop_reason"] = delta.stop_reason
        yield chunk(choice)
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(num_prompt_tokens, sum(tokens), sum(cached[::body.n]))}
