"""POST /v1/messages: the Anthropic Messages API on the chat path, streamed or not (and count_tokens).

Text and tool_use blocks out, text, tool_use and tool_result blocks in (messages_protocol.py). Tools are
planned and parsed as on chat (tools.py): tool_choice any / tool is the same grammar as required / a named
function, so a forced call parses and validates. Errors use Anthropic's shape: {"type": "error", ...}.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.chat import chat_prompt_ids
from blink.frontend.constraint_fields import StructuredFields
from blink.frontend.errors import APIError, anthropic_error_body
from blink.frontend.generation import Delta, collect, generate
from blink.frontend.messages_protocol import (
    MessagesPrompt,
    MessagesRequest,
    to_chat_choice,
    to_chat_messages,
    to_chat_tools,
    tool_use_block,
)
from blink.frontend.protocol import SamplingFields
from blink.frontend.serving import FrontendState, arrival, request_id, sse, unless_disconnected
from blink.frontend.structured import constrain, hold
from blink.frontend.tools import ToolPlan, ToolStream, parse_tool_calls, plan_tools

__all__ = ["MessagesPrompt", "MessagesRequest", "count_message_tokens", "create_message"]


def _stop(delta: Delta, used_tool: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished choice."""
    if used_tool:
        return "tool_use", None
    if delta.finish_reason == "length":
        return "max_tokens", None
    if isinstance(delta.stop_reason, str):
        return "stop_sequence", delta.stop_reason
    return "end_turn", None


async def count_message_tokens(state: FrontendState, body: MessagesPrompt):
    """POST /v1/messages/count_tokens: the prompt /v1/messages would run, counted (rendered, not run).
    An APIError raised here gets Anthropic's shape from the app's handler (errors.ANTHROPIC_PATHS)."""
    _, prompt_ids = await _prompt(state, body)
    return {"input_tokens": len(prompt_ids)}


async def _prompt(state: FrontendState, body: MessagesPrompt) -> tuple[ToolPlan | None, list[int]]:
    """The tool plan and the templated prompt's ids (400s for what cannot be served)."""
    state.check_model(body.model)
    try:
        messages = to_chat_messages(body)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    try:
        choice, parallel = to_chat_choice(body.tool_choice)
    except ValueError as e:
        raise APIError(400, str(e), "tool_choice") from None
    chat_tools = to_chat_tools(body.tools)
    template = state.tokenizer.chat_template
    tools = plan_tools(chat_tools, choice, parallel, template and template.source)
    prompt_ids = await chat_prompt_ids(state, messages, True, None, chat_tools)
    state.check_prompt(prompt_ids)
    return tools, prompt_ids


async def create_message(state: FrontendState, body: MessagesRequest, request: Request):
    tools, prompt_ids = await _prompt(state, body)
    parsing = tools if tools is not None and tools.parse else None  # tool_choice none: the text stays text
    fields = SamplingFields(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                            stop=body.stop_sequences)
    params = state.sampling_params(fields, prompt_ids, body.max_tokens, None, 0)
    state.check_engine()
    constraint = await constrain(state, StructuredFields(), [params], tools.constraint if tools else None)
    stream = hold(state, constraint, generate(state.generation_for(fields), prompt_ids, params,
                                              arrival=arrival(request)))
    message = {"id": f"msg_{request_id(request)}", "type": "message", "role": "assistant",
               "model": state.served_model_name}
    if body.stream:
        events = _events(stream, message, len(prompt_ids), parsing)
        return StreamingResponse(_sse(events), media_type="text/event-stream")
    result = await unless_disconnected(request, collect(stream))
    if result.error:
        raise APIError(500, "the engine failed the request")
    text, calls = parse_tool_calls(result.text, parsing) if parsing else (result.text, [])
    content = [{"type": "text", "text": text}] if text or not calls else []
    content += [tool_use_block(call) for call in calls]
    stop_reason, stop_sequence = _stop(result, bool(calls))
    return JSONResponse({**message, "content": content, "stop_reason": stop_reason,
                         "stop_sequence": stop_sequence,
                         "usage": {"input_tokens": len(prompt_ids), "output_tokens": result.num_tokens}})


async def _events(stream: AsyncIterator[Delta], message: dict, num_prompt_tokens: int,
                  tools: ToolPlan | None) -> AsyncIterator[tuple[str, dict]]:
    """Text deltas until a tool call may begin (tools.py's ToolStream holds the rest); at the end, the
    held text and then each call as a tool_use block with its whole input in one input_json_delta."""
    yield "message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": num_prompt_tokens, "output_tokens": 0}}}
    parser = ToolStream(tools) if tools else None
    index, text_open, calls, last = 0, False, [], Delta("")
    async for delta in stream:
        if delta.error:
            raise APIError(500, "the engine failed the request")
        text = parser.feed(delta.text) if parser else delta.text
        if parser and delta.finish_reason:
            rest, calls = parser.finish()
            text += rest
        if text:
            if not text_open:
                yield "content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {"type": "text", "text": ""}}
                text_open = True
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "text_delta", "text": text}}
        last = delta
    if text_open:
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
        index += 1
    for call in calls:
        block = tool_use_block(call)
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {**block, "input": {}}}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
            "type": "input_json_delta", "partial_json": call["function"]["arguments"]}}  # the input's JSON
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
        index += 1
    stop_reason, stop_sequence = _stop(last, bool(calls))
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
