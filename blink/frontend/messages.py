"""POST /v1/messages: the Anthropic Messages API on the chat path, streamed or not (and count_tokens).

Thinking (under --reasoning-parser), text and tool_use blocks out, text, tool_use and tool_result blocks in
(messages_protocol.py). The output is shaped as on chat (chat_output.py: the reasoning block, then tool
calls parsed from the rest): tool_choice any / tool is the same grammar as required / a named function,
so a forced call parses and validates. Errors use Anthropic's shape: {"type": "error", ...}.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.chat import ChatPrompt, after_thinking, chat_prompt
from blink.frontend.chat_output import ChoiceStream, ReasoningPlan, assistant_message
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
    tool_use_id,
)
from blink.frontend.protocol import SamplingFields
from blink.frontend.serving import FrontendState, arrival, request_id, sse, unless_disconnected
from blink.frontend.structured import constrain, hold
from blink.frontend.tools import ToolPlan, plan_tools
from blink.text.reasoning import OPEN

__all__ = ["MessagesPrompt", "MessagesRequest", "count_message_tokens", "create_message"]


def _stop(delta: Delta, used_tool: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished choice (max_tokens first: a call it cut is
    unfinished, as chat's finish_reason stays `length`)."""
    if delta.finish_reason == "length":
        return "max_tokens", None
    if used_tool:
        return "tool_use", None
    if isinstance(delta.stop_reason, str):
        return "stop_sequence", delta.stop_reason
    return "end_turn", None


async def count_message_tokens(state: FrontendState, body: MessagesPrompt):
    """POST /v1/messages/count_tokens: the prompt /v1/messages would run, counted (rendered, not run).
    An APIError raised here gets Anthropic's shape from the app's handler (errors.ANTHROPIC_PATHS)."""
    _, prompt = await _prompt(state, body)
    return {"input_tokens": len(prompt.ids)}


async def _prompt(state: FrontendState, body: MessagesPrompt) -> tuple[ToolPlan | None, ChatPrompt]:
    """The tool plan and the templated prompt (400s for what cannot be served)."""
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
    tools = plan_tools(chat_tools, choice, parallel, state.tool_format())
    prefill = _prefill(messages)
    prompt = await chat_prompt(state, messages, not prefill, None, chat_tools, continue_final_message=prefill)
    state.check_prompt(prompt.ids)
    return tools, prompt


def _prefill(messages: list) -> bool:
    """Anthropic's prefill: a final assistant message is the start of the answer, which the model goes on
    writing (the template leaves it open). An empty one asks for nothing and is dropped."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant" or (last.model_extra or {}).get("tool_calls"):
        return False
    if not (last.content or "").strip():
        messages.pop()
        return False
    if last.content != last.content.rstrip():  # Anthropic's rule: the continuation would start mid-whitespace
        raise APIError(400, "final assistant content cannot end with trailing whitespace", "messages")
    return True


async def create_message(state: FrontendState, body: MessagesRequest, request: Request):
    tools, prompt = await _prompt(state, body)
    prompt_ids = prompt.ids
    parsing = tools if tools is not None and tools.parse else None  # tool_choice none: the text stays text
    reasoning = ReasoningPlan(state.reasoning, prompt.thought == OPEN) if state.reasoning else None
    fields = SamplingFields(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                            stop=body.stop_sequences)
    params = state.sampling_params(fields, prompt_ids, body.max_tokens, None, 0)
    state.check_engine()
    constraint = await constrain(state, StructuredFields(), [params], tools.constraint if tools else None,
                                 after_thinking(state, prompt))
    stream = hold(state, constraint, generate(state.generation_for(fields), prompt_ids, params,
                                              arrival=arrival(request)))
    message = {"id": f"msg_{request_id(request)}", "type": "message", "role": "assistant",
               "model": state.served_model_name}
    if body.stream:
        events = _events(stream, message, len(prompt_ids), ChoiceStream(reasoning, parsing))
        return StreamingResponse(_sse(events), media_type="text/event-stream")
    result = await unless_disconnected(request, collect(stream))
    if result.error:
        raise APIError(500, "the engine failed the request")
    out, _ = assistant_message(result.text, result.finish_reason, reasoning, parsing)
    calls = out.get("tool_calls") or []
    content = [] if out.get("reasoning") is None else [_thinking_block(out["reasoning"])]
    if out["content"] or not (calls or content):
        content.append({"type": "text", "text": out["content"] or ""})
    content += [tool_use_block(call) for call in calls]
    stop_reason, stop_sequence = _stop(result, bool(calls))
    return JSONResponse({**message, "content": content, "stop_reason": stop_reason,
                         "stop_sequence": stop_sequence,
                         "usage": {"input_tokens": len(prompt_ids), "output_tokens": result.num_tokens}})


def _thinking_block(text: str) -> dict:
    # Anthropic signs its thinking so that it can be passed back; blink has nothing to sign (empty)
    return {"type": "thinking", "thinking": text, "signature": ""}


async def _events(stream: AsyncIterator[Delta], message: dict, num_prompt_tokens: int,
                  output: ChoiceStream) -> AsyncIterator[tuple[str, dict]]:
    """A thinking block while the model reasons, text deltas until a tool call may begin, then a tool_use
    block per call: its input's JSON text as it is written where the grammar forces the call, else whole
    at the end (chat_output.ChoiceStream)."""
    yield "message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": num_prompt_tokens, "output_tokens": 0}}}
    index, open_block, last = 0, None, Delta("")

    def switch(kind: str, block: dict) -> list[tuple[str, dict]]:
        """Close the open block (if any) and open `block` in its place."""
        nonlocal index, open_block
        events = []
        if open_block is not None:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        open_block = kind
        return [*events, ("content_block_start", {"type": "content_block_start", "index": index,
                                                  "content_block": block})]

    def block_delta(delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}

    async for delta in stream:
        if delta.error:
            raise APIError(500, "the engine failed the request")
        piece = output.finish(delta.text) if delta.finish_reason else output.feed(delta.text)
        for kind, text in (("thinking", piece.thought), ("text", piece.content)):  # the thought comes first
            if text:
                if open_block != kind:
                    for event in switch(kind, _thinking_block("") if kind == "thinking" else {"type": "text",
                                                                                              "text": ""}):
                        yield event
                yield block_delta({"type": f"{kind}_delta", kind: text})
        for entry in piece.calls:  # an entry with an id starts a call; each carries arguments text (or "")
            if "id" in entry:
                block = {"type": "tool_use", "id": tool_use_id(entry["id"]), "name": entry["function"]["name"],
                         "input": {}}
                for event in switch("tool_use", block):
                    yield event
            if entry["function"]["arguments"]:
                yield block_delta({"type": "input_json_delta", "partial_json": entry["function"]["arguments"]})
        last = delta
    if open_block is not None:
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop_reason, stop_sequence = _stop(last, output.used_tools)
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
