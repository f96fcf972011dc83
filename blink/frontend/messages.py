"""POST /v1/messages: the Anthropic Messages API on the chat path, streamed or not.

Text and tool_use blocks out (tool calls parsed from the text, see tool_calls.py), text, tool_use and
tool_result blocks in (messages_protocol.py). Errors use Anthropic's shape: {"type": "error", ...}.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.chat import chat_prompt_ids
from blink.frontend.errors import APIError, anthropic_error_body
from blink.frontend.generation import Delta, collect, generate
from blink.frontend.messages_protocol import (
    MessagesRequest,
    input_json,
    to_chat_messages,
    to_chat_tools,
    tool_use_block,
)
from blink.frontend.protocol import SamplingFields
from blink.frontend.serving import FrontendState, arrival, request_id, sse, unless_disconnected
from blink.frontend.tool_calls import ToolCall, ToolCallSplitter, split_tool_calls

__all__ = ["MessagesRequest", "create_message"]


async def create_message(state: FrontendState, body: MessagesRequest, request: Request):
    try:
        return await _create(state, body, request)
    except APIError as e:
        return JSONResponse(anthropic_error_body(e.status, e.message), status_code=e.status)


def _stop(delta: Delta, used_tool: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished choice."""
    if used_tool:
        return "tool_use", None
    if delta.finish_reason == "length":
        return "max_tokens", None
    if isinstance(delta.stop_reason, str):
        return "stop_sequence", delta.stop_reason
    return "end_turn", None


async def _create(state: FrontendState, body: MessagesRequest, request: Request):
    state.check_model(body.model)
    if body.tool_choice is not None and body.tool_choice != {"type": "auto"}:
        raise APIError(400, 'only tool_choice {"type": "auto"} is supported (forcing a tool needs '
                            "constrained decoding)", "tool_choice")
    try:
        messages = to_chat_messages(body)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    prompt_ids = await chat_prompt_ids(state, messages, True, None, to_chat_tools(body.tools))
    state.check_prompt(prompt_ids)
    fields = SamplingFields(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                            stop=body.stop_sequences)
    params = state.sampling_params(fields, prompt_ids, body.max_tokens, None, 0)
    state.check_engine()
    stream = generate(state.generation_for(fields), prompt_ids, params, arrival=arrival(request))
    message = {"id": f"msg_{request_id(request)}", "type": "message", "role": "assistant",
               "model": state.served_model_name}
    if body.stream:
        events = _events(stream, message, len(prompt_ids), bool(body.tools))
        return StreamingResponse(_sse(events), media_type="text/event-stream")
    result = await unless_disconnected(request, collect(stream))
    if result.error:
        raise APIError(500, "the engine failed the request")
    pieces = split_tool_calls(result.text) if body.tools else [result.text]
    content = [tool_use_block(p) if isinstance(p, ToolCall) else {"type": "text", "text": p} for p in pieces]
    stop_reason, stop_sequence = _stop(result, any(isinstance(p, ToolCall) for p in pieces))
    return JSONResponse({**message, "content": content, "stop_reason": stop_reason,
                         "stop_sequence": stop_sequence,
                         "usage": {"input_tokens": len(prompt_ids), "output_tokens": result.num_tokens}})


async def _events(stream: AsyncIterator[Delta], message: dict, num_prompt_tokens: int,
                  tools: bool) -> AsyncIterator[tuple[str, dict]]:
    yield "message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": num_prompt_tokens, "output_tokens": 0}}}
    splitter = ToolCallSplitter() if tools else None
    index, text_open, used_tool, last = 0, False, False, Delta("")
    async for delta in stream:
        if delta.error:
            raise APIError(500, "the engine failed the request")
        pieces = splitter.feed(delta.text) if splitter else [delta.text]
        if splitter and delta.finish_reason:
            pieces += splitter.flush()
        for piece in pieces:
            if isinstance(piece, str):
                if not piece:
                    continue
                if not text_open:
                    yield "content_block_start", {"type": "content_block_start", "index": index,
                                                  "content_block": {"type": "text", "text": ""}}
                    text_open = True
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": piece}}
                continue
            if text_open:
                yield "content_block_stop", {"type": "content_block_stop", "index": index}
                index, text_open = index + 1, False
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {**tool_use_block(piece), "input": {}}}
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "input_json_delta", "partial_json": input_json(piece)}}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index, used_tool = index + 1, True
        last = delta
    if text_open:
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop_reason, stop_sequence = _stop(last, used_tool)
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                               "stop_sequence": stop_sequence},
                            "usage": {"output_tokens": last.num_tokens}}
    yield "message_stop", {"type": "message_stop"}


async def _sse(events: AsyncIterator[tuple[str, dict]]) -> AsyncIterator[bytes]:
    """Anthropic's framing: a named event per message; an error mid-stream is an `error` event."""
    try:
        async for name, data in events:
            yield sse(data, name)
    except APIError as e:
        yield sse(anthropic_error_body(e.status, e.message), "error")
    except Exception as e:  # headers are sent: the error can only travel as an event
        yield sse(anthropic_error_body(500, f"internal error: {type(e).__name__}: {e}"), "error")
