"""POST /v1/responses: OpenAI's Responses API on the chat path, streamed or not.

Input items become template messages (responses_protocol.py); the output is shaped as on chat
(chat_output.py): a reasoning item (under --reasoning-parser), a message item, a function_call item per
call. Streams send OpenAI's typed events, each with its sequence_number.
"""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from blink.frontend.chat import after_thinking, chat_prompt
from blink.frontend.chat_output import ChoiceStream, Piece, ReasoningPlan, assistant_message
from blink.frontend.errors import APIError, error_body
from blink.frontend.generation import Delta, collect, generate
from blink.frontend.protocol import SamplingFields
from blink.frontend.responses_protocol import (
    ResponsesRequest,
    to_chat_choice,
    to_chat_messages,
    to_chat_tools,
    to_response_format,
)
from blink.frontend.serving import FrontendState, arrival, now, request_id, sse, unless_disconnected
from blink.frontend.structured import constrain, hold
from blink.frontend.tools import plan_tools
from blink.text.reasoning import OPEN

__all__ = ["ResponsesRequest", "create_response"]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


async def create_response(state: FrontendState, body: ResponsesRequest, request: Request):
    state.check_model(body.model)
    if body.store:
        raise APIError(400, "store=true is not supported: blink keeps no responses", "store")
    try:
        messages = to_chat_messages(body)
        choice = to_chat_choice(body.tool_choice)
        response_format = to_response_format(body.text)
    except ValueError as e:
        param = "tool_choice" if "tool_choice" in str(e) else "text.format" if "format" in str(e) else "input"
        raise APIError(400, str(e), param) from None
    chat_tools = to_chat_tools(body.tools)
    tools = plan_tools(chat_tools, choice, body.parallel_tool_calls, state.tool_format())
    prompt = await chat_prompt(state, messages, True, None, chat_tools)
    state.check_prompt(prompt.ids)
    fields = SamplingFields(temperature=body.temperature, top_p=body.top_p, response_format=response_format)
    try:
        params = state.sampling_params(fields, prompt.ids, body.max_output_tokens, None, 0)
        state.check_engine()
        constraint = await constrain(state, fields, [params], tools.constraint if tools else None,
                                     after_thinking(state, prompt))
    except APIError as e:  # chat's field names, as the Responses API spells them
        if e.param:
            e.param = e.param.replace("response_format.json_schema", "text.format").replace(
                "response_format", "text.format").replace("max_tokens", "max_output_tokens")
        raise
    stream = hold(state, constraint, generate(state.generation_for(fields), prompt.ids, params,
                                              arrival=arrival(request)))
    reasoning = ReasoningPlan(state.reasoning, prompt.thought == OPEN) if state.reasoning else None
    parsing = tools if tools is not None and tools.parse else None
    head = _head(state, body, request)
    if body.stream:
        events = _events(state, stream, head, len(prompt.ids), ChoiceStream(reasoning, parsing))
        return StreamingResponse(_sse(events), media_type="text/event-stream")
    result = await unless_disconnected(request, collect(stream))
    if result.error:
        raise APIError(500, "the engine failed the request")
    message, _ = assistant_message(result.text, result.finish_reason, reasoning, parsing)
    output = []
    if message.get("reasoning") is not None:
        output.append(_reasoning_item(_id("rs"), message["reasoning"], "completed"))
    if message["content"] or not (output or message.get("tool_calls")):
        output.append(_message_item(_id("msg"), message["content"] or "", "completed"))
    output += [_call_item(_id("fc"), c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
               for c in message.get("tool_calls") or []]
    usage = await _usage(state, len(prompt.ids), result, message.get("reasoning"))
    return JSONResponse(_finished(head, output, result, usage))


def _head(state: FrontendState, body: ResponsesRequest, request: Request) -> dict:
    """The response object's configuration, as OpenAI echoes it (output and usage come later)."""
    fmt = body.text.format if body.text and body.text.format else None
    return {"id": f"resp_{request_id(request)}", "object": "response", "created_at": now(), "status": "in_progress",
            "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "model": state.served_model_name, "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": None, "store": False,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": body.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled", "usage": None,
            "user": body.user, "metadata": body.metadata or {}}


def _finished(head: dict, output: list[dict], last: Delta, usage: dict) -> dict:
    cut = last.finish_reason == "length"
    return {**head, "status": "incomplete" if cut else "completed", "output": output, "usage": usage,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None}


async def _usage(state: FrontendState, input_tokens: int, last: Delta, reasoning: str | None) -> dict:
    # reasoning_tokens: the reasoning text's length re-tokenized (the engine counts tokens, not blocks)
    # (on the pool, past the prompt-prefix cache: an answer's text is no prompt to learn)
    thought = len(await state.text.run(state.tokenizer.encode_released, reasoning, False)) if reasoning else 0
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": last.cached_tokens},
            "output_tokens": last.num_tokens, "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": input_tokens + last.num_tokens}


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if text or status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class _Items:
    """The stream's output items: one open at a time, each opened and closed with OpenAI's events."""

    def __init__(self):
        self.output: list[dict] = []  # the finished items
        self.open: dict | None = None  # kind, id, text (or arguments) so far, call_id and name for calls

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index, text = len(self.output), item["text"]
        if item["kind"] == "reasoning":
            done = _reasoning_item(item["id"], text, "completed")
            events = [{"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "text": text}]
        elif item["kind"] == "message":
            done = _message_item(item["id"], text, "completed")
            part = done["content"][0]
            events = [{"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "text": text, "logprobs": []},
                      {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "part": part}]
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], text, "completed")
            events = [{"type": "response.function_call_arguments.done", "item_id": item["id"],
                       "output_index": index, "arguments": text}]
        self.output.append(done)
        return [*events, {"type": "response.output_item.done", "output_index": index, "item": done}]

    def _start(self, kind: str, **extra) -> list[dict]:
        events = self._close()
        prefix = {"reasoning": "rs", "message": "msg"}.get(kind, "fc")
        self.open = {"kind": kind, "id": _id(prefix), "text": "", **extra}
        index, item_id = len(self.output), self.open["id"]
        if kind == "reasoning":
            return [*events, {"type": "response.output_item.added", "output_index": index,
                              "item": _reasoning_item(item_id, "", "in_progress")}]
        if kind == "message":
            return [*events, {"type": "response.output_item.added", "output_index": index,
                              "item": _message_item(item_id, None, "in_progress")},
                    {"type": "response.content_part.added", "item_id": item_id, "output_index": index,
                     "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [],
                                                  "logprobs": []}}]
        return [*events, {"type": "response.output_item.added", "output_index": index,
                          "item": _call_item(item_id, extra["call_id"], extra["name"], "", "in_progress")}]

    def add(self, piece: Piece) -> list[dict]:
        events = []
        for kind, text in (("reasoning", piece.thought), ("message", piece.content)):  # the thought first
            if not text:
                continue
            if self.open is None or self.open["kind"] != kind:
                events += self._start(kind)
            self.open["text"] += text
            events.append({"type": "response.reasoning_text.delta" if kind == "reasoning" else
                           "response.output_text.delta", "item_id": self.open["id"], "output_index": len(self.output),
                           "content_index": 0, "delta": text, **({"logprobs": []} if kind == "message" else {})})
        for entry in piece.calls:  # an entry with an id starts a call; each carries arguments text (or "")
            if "id" in entry:
                events += self._start("function_call", call_id=entry["id"], name=entry["function"]["name"])
            if entry["function"]["arguments"]:
                self.open["text"] += entry["function"]["arguments"]
                events.append({"type": "response.function_call_arguments.delta", "item_id": self.open["id"],
                               "output_index": len(self.output), "delta": entry["function"]["arguments"]})
        return events

    def finish(self) -> list[dict]:
        events = self._close()
        if not self.output:  # an empty answer is still a message
            events += self._start("message") + self._close()
        return events


async def _events(state: FrontendState, stream: AsyncIterator[Delta], head: dict, num_prompt_tokens: int,
                  output: ChoiceStream) -> AsyncIterator[dict]:
    yield {"type": "response.created", "response": head}
    yield {"type": "response.in_progress", "response": head}
    items, last, reasoning = _Items(), Delta(""), ""
    async for delta in stream:
        if delta.error:
            raise APIError(500, "the engine failed the request")
        piece = output.finish(delta.text) if delta.finish_reason else output.feed(delta.text)
        reasoning += piece.thought
        for event in items.add(piece):
            yield event
        last = delta
    for event in items.finish():
        yield event
    response = _finished(head, items.output, last, await _usage(state, num_prompt_tokens, last, reasoning))
    yield {"type": "response.incomplete" if response["status"] == "incomplete" else "response.completed",
           "response": response}


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Named events with their sequence_number; an error mid-stream is an `error` event."""
    number = 0
    try:
        async for event in events:
            yield sse({**event, "sequence_number": number}, event["type"])
            number += 1
    except APIError as e:
        yield sse({"type": "error", **error_body(e.status, e.message, e.param)["error"], "sequence_number": number},
                  "error")
    except Exception as e:  # headers are sent: the error can only travel as an event
        yield sse({"type": "error", "code": None, "message": f"internal error: {type(e).__name__}: {e}",
                   "param": None, "sequence_number": number}, "error")
