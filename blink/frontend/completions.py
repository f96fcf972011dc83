"""POST /v1/completions: prompts (text, texts, token ids), n choices each, streamed or not.

echo with logprobs prepends the prompt's tokens and logprobs (the first token's is None), as OpenAI; echo
with max_tokens 0 returns only the prompt (lm-eval's loglikelihood requests): the engine generates one
token, which is left out. prompt_logprobs (vLLM's) adds each choice's `prompt_logprobs` list.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.errors import APIError
from blink.frontend.generation import Delta, TokenLogprob, collect, generate, merge
from blink.frontend.prompt_logprobs import check_prompt_logprobs, echo_logprobs, join_logprobs, vllm_prompt_logprobs
from blink.frontend.protocol import CompletionRequest
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


def _check_request(state: FrontendState, body: CompletionRequest) -> None:
    if body.suffix:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.echo and body.logprobs is not None:
        check_prompt_logprobs(state, body.logprobs, "logprobs")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, f"best_of must equal n ({body.n}): ranking extra candidates is not supported",
                       "best_of")


async def create_completion(state: FrontendState, body: CompletionRequest, request: Request):
    state.check_model(body.model)
    state.check_fields(body)
    _check_request(state, body)
    prompts = await prompt_token_lists(state, body.prompt, body.add_special_tokens)
    echo_only = body.echo and body.max_tokens == 0
    wanted = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    prompt_k = max(wanted) if wanted else None
    params = [[state.sampling_params(body, ids, 1 if echo_only else body.max_tokens, body.logprobs, j, prompt_k)
               for j in range(body.n)] for ids in prompts]
    state.check_engine()
    echo = [await state.text.decode(ids) if body.echo else "" for ids in prompts]
    constraint = await constrain(state, body, [p for choice_params in params for p in choice_params])
    generation = state.generation_for(body)
    streams = [hold(state, constraint, generate(generation, ids, p, body.skip_special_tokens, body.keep_stop,
                                                arrival(request)))
               for ids, choice_params in zip(prompts, params, strict=True) for p in choice_params]
    num_prompt_tokens = sum(len(ids) for ids in prompts)
    head = {"id": f"cmpl-{request_id(request)}", "object": "text_completion", "created": now(),
            "model": state.served_model_name}
    if body.stream:
        chunks = _stream_chunks(state, body, head, streams, prompts, echo, num_prompt_tokens)
        return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
    results: list[Delta] = await unless_disconnected(request, _collect_all(streams))
    choices = []
    for index, result in enumerate(results):
        if result.error:
            raise APIError(500, "the engine failed the request")
        prefix, prompt_ids = echo[index // body.n], prompts[index // body.n]
        as_ids = body.return_tokens_as_token_ids
        if echo_only:  # the one generated token is not part of the answer
            result = Delta("", finish_reason="length", cached_tokens=result.cached_tokens,
                           prompt_logprobs=result.prompt_logprobs)
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(state, result.logprobs, len(prefix), as_ids)
            if body.echo:
                logprobs = join_logprobs(echo_logprobs(state, prompt_ids, result.prompt_logprobs, body.logprobs,
                                                       as_ids), logprobs)
        choice = {"index": index, "text": prefix + result.text, "logprobs": logprobs,
                  "finish_reason": result.finish_reason, "stop_reason": result.stop_reason}
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(state, result.prompt_logprobs, body.prompt_logprobs,
                                                             as_ids)
        choices.append(choice)
        results[index] = result
    completion_tokens = sum(r.num_tokens for r in results)
    cached = sum(r.cached_tokens for r in results[::body.n])  # each prompt once: its first choice's hit
    return JSONResponse({**head, "choices": choices, "usage": usage(num_prompt_tokens, completion_tokens, cached)})


async def _collect_all(streams) -> list[Delta]:
    return list(await asyncio.gather(*(collect(s) for s in streams)))


async def _stream_chunks(state: FrontendState, body: CompletionRequest, head: dict, streams, prompts: list[list[int]],
                         echo: list[str], num_prompt_tokens: int) -> AsyncIterator[dict]:
    tokens, cached = [0] * len(streams), [0] * len(streams)
    offsets = [len(echo[i // body.n]) for i in range(len(streams))]
    echo_only = body.echo and body.max_tokens == 0
    as_ids = body.return_tokens_as_token_ids
    # With logprobs, a choice's echo waits for its prompt logprobs, which come with its first delta.
    echoed = [not body.echo or body.logprobs is None] * len(streams)

    def chunk(choice: dict) -> dict:
        out = {**head, "choices": [choice]}
        if body.continuous_usage:  # vLLM's continuous_usage_stats: usage so far in every chunk
            out["usage"] = usage(num_prompt_tokens, sum(tokens))
        return out

    if body.echo and body.logprobs is None:
        for index in range(len(streams)):
            yield chunk({"index": index, "text": echo[index // body.n], "logprobs": None, "finish_reason": None})
    async for index, delta in merge(streams):
        if delta.error:
            raise APIError(500, "the engine failed the request")
        if not echoed[index]:
            echoed[index] = True
            lps = echo_logprobs(state, prompts[index // body.n], delta.prompt_logprobs, body.logprobs, as_ids)
            yield chunk({"index": index, "text": echo[index // body.n], "logprobs": lps, "finish_reason": None})
        if echo_only:  # the one generated token is not part of the answer: only the finish is sent
            if delta.finish_reason is not None:
                cached[index] = delta.cached_tokens
                lps = None if body.logprobs is None else completion_logprobs(state, [], offsets[index], as_ids)
                yield chunk({"index": index, "text": "", "logprobs": lps, "finish_reason": "length",
                             "stop_reason": None})
            continue
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
