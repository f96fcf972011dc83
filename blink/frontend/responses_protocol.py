"""OpenAI's Responses API request body, and its mapping onto the chat path (template messages, tools,
response format). blink keeps no responses: `store` true, `previous_response_id` and `background` are
refused, and so is every field not declared here (a 400 that names it).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from blink.frontend.protocol import ChatMessage, Strict


class InputText(Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # output_text passed back: only null or empty
    logprobs: list[dict[str, Any]] | None = None  # output_text passed back: not part of the prompt


class Message(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    id: str | None = None  # an earlier output item passed back
    status: str | None = None


class FunctionCall(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class Reasoning(Strict):
    """An earlier answer's reasoning passed back: dropped from the prompt, as thinking templates drop it."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    status: str | None = None


def _item_type(item: Any) -> str:
    """A message may leave its type out (OpenAI's "easy" input message)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if isinstance(kind, str) else "message"


Item = Annotated[Annotated[Message, Tag("message")] | Annotated[FunctionCall, Tag("function_call")]
                 | Annotated[FunctionCallOutput, Tag("function_call_output")] | Annotated[Reasoning, Tag("reasoning")],
                 Discriminator(_item_type)]


class FunctionTool(Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # calls forced by tool_choice follow the schema with or without it


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(Strict):
    format: TextFormat | None = None


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None  # false or null: blink keeps no responses; true is refused
    metadata: dict[str, str] | None = None  # returned in the response, as OpenAI does
    user: str | None = None  # written to the access log


def _text(content: str | list[InputText]) -> str:
    if isinstance(content, str):
        return content
    if any(part.annotations for part in content):
        raise ValueError("annotations on input text are not supported")
    return "\n".join(part.text for part in content)


def to_chat_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """Template messages in OpenAI chat's shape: function_call items -> an assistant message's tool_calls
    (consecutive ones together, as parallel calls), function_call_output -> role "tool"."""
    out = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    items = [Message(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for item in items:
        if isinstance(item, Message):
            role = "system" if item.role == "developer" else item.role  # OpenAI's newer name for system
            out.append(ChatMessage(role=role, content=_text(item.content)))
        elif isinstance(item, FunctionCall):
            try:
                arguments = json.loads(item.arguments)
            except json.JSONDecodeError as e:
                raise ValueError(f"function_call {item.call_id}: arguments are not JSON ({e})") from None
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and (last.model_extra or {}).get("tool_calls"):
                last.model_extra["tool_calls"].append(call)
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutput):
            out.append(ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id))
    if not out or all(m.role == "system" for m in out):
        raise ValueError("input has no message")
    return out


def to_chat_tools(tools: list[FunctionTool] | None) -> list[dict] | None:
    if not tools:
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in tools]


def to_chat_choice(choice: Any) -> Any:
    """Chat's tool_choice for the Responses API's ({"type": "function", "name": ...} is flat here)."""
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    raise ValueError('tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}')


def to_response_format(text: TextConfig | None) -> dict | None:
    """Chat's response_format for `text.format` (None: free text)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise ValueError("text.format json_schema needs a schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "response", "schema": fmt.schema_,
                                                   "strict": fmt.strict}}
