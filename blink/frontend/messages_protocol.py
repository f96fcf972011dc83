"""The Anthropic Messages API's request body, and its mapping onto the chat path (template messages).

Content blocks understood: text, tool_use (assistant), tool_result (user), thinking (assistant: an earlier
answer's reasoning, passed back by clients and dropped, as thinking models' templates drop it). Others
(image, document, redacted_thinking...) are a 400 that names them. `cache_control` on blocks and tools is
accepted and has no effect: it is a prompt-caching hint, and blink's output does not depend on it
(docs/api.md says so).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from blink.frontend.protocol import ChatMessage, Strict


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None  # only null/empty is accepted (see to_chat_messages)


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # the tool that "tool" forces
    disable_parallel_tool_use: bool | None = None


class Metadata(Strict):
    user_id: str | None = None  # written to the access log


class MessagesPrompt(Strict):
    """What makes the prompt: the body of /v1/messages/count_tokens, and the start of /v1/messages'."""
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(MessagesPrompt):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None


def _text(blocks: str | list[TextBlock] | None) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    if any(b.citations for b in blocks):
        raise ValueError("citations on text blocks are not supported")
    return "\n".join(b.text for b in blocks)


def to_chat_messages(body: MessagesPrompt) -> list[ChatMessage]:
    """Template messages in OpenAI's shape: tool_use -> assistant tool_calls, tool_result -> role "tool"."""
    out = [ChatMessage(role="system", content=_text(body.system))] if body.system else []
    for message in body.messages:
        if isinstance(message.content, str):
            out.append(ChatMessage(role=message.role, content=message.content))
            continue
        texts: list[str] = []
        calls: list[dict] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                texts.append(_text([block]))
            elif isinstance(block, ThinkingBlock):
                if message.role != "assistant":
                    raise ValueError("thinking blocks belong to assistant messages")
            elif isinstance(block, ToolUseBlock):
                if message.role != "assistant":
                    raise ValueError("tool_use blocks belong to assistant messages")
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": block.input}})
            else:
                if message.role != "user":
                    raise ValueError("tool_result blocks belong to user messages")
                if texts:  # keep the order: text before this result is its own message
                    out.append(ChatMessage(role="user", content="\n".join(texts)))
                    texts = []
                content = _text(block.content)
                out.append(ChatMessage(role="tool", content=f"Error: {content}" if block.is_error else content,
                                       tool_call_id=block.tool_use_id))
        if texts or calls:
            extra = {"tool_calls": calls} if calls else {}
            out.append(ChatMessage(role=message.role, content="\n".join(texts), **extra))
    return out


def to_chat_tools(tools: list[Tool] | None) -> list[dict] | None:
    if not tools:
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}} for t in tools]


def to_chat_choice(choice: ToolChoice | None) -> tuple[Any, bool | None]:
    """OpenAI's tool_choice and parallel_tool_calls for Anthropic's tool_choice (any = required)."""
    if choice is None:
        return None, None
    if (choice.type == "tool") != (choice.name is not None):
        raise ValueError('tool_choice.name goes with type "tool" and only with it')
    if choice.type == "none" and choice.disable_parallel_tool_use is not None:
        raise ValueError('tool_choice.disable_parallel_tool_use does not go with type "none"')
    openai = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
    if choice.type == "tool":
        openai = {"type": "function", "function": {"name": choice.name}}
    return openai, (None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use)


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def tool_use_block(call: dict) -> dict:
    """A parsed call (OpenAI's shape, blink/frontend/tools.py) as a tool_use block."""
    return {"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}
