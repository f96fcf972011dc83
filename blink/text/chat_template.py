"""Chat template rendering the way transformers' apply_chat_template does it (sandboxed jinja2)."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters, which chat templates do not expect
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def chat_template_source(arg: str) -> str:
    """--chat-template (vLLM's flag): a file's path, or the template itself when it has jinja syntax."""
    try:
        if Path(arg).is_file():
            return Path(arg).read_text()
    except OSError:  # a template too long to be a file name
        pass
    if "{{" in arg or "{%" in arg:
        return arg
    raise ValueError(f"--chat-template {arg!r} is neither a file nor a template (no {{{{ or {{% in it)")


class ChatTemplate:
    """A compiled chat template plus the tokenizer's special-token strings it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str]):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"chat template syntax error on line {e.lineno}: {e.message}") from None
        self.source = source  # tool calling reads the model family's call format from it
        self.special_tokens = dict(special_tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, continue_final_message: bool = False,
               **chat_template_kwargs: Any) -> str:
        """The prompt text. Raises ValueError (one line) when the template refuses the conversation.

        continue_final_message: the last message is left open (no end-of-turn after it), so the model goes
        on writing it, as transformers does: the text is cut after that message's last occurrence."""
        variables = {**self.special_tokens, "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            variables["tools"] = tools
        variables.update(chat_template_kwargs)
        try:
            text = self.template.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"chat template error: {e}") from None
        return _cut_after_final(text, messages[-1]) if continue_final_message else text


def _cut_after_final(text: str, final: dict[str, Any]) -> str:
    content = final.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError("continue_final_message needs a final message with text content")
    # some templates trim a message before writing it (Llama 3's), so the stripped text is the fallback
    for needle in (content, content.strip()):
        at = text.rfind(needle)
        if at >= 0:
            return text[:at + len(needle)]
    raise ValueError("continue_final_message: the chat template does not write the final message's text as it is")


@lru_cache(maxsize=16)
def compiled_template(source: str, special_tokens: tuple[tuple[str, str], ...]) -> ChatTemplate:
    """A request's own template (vLLM's `chat_template` field), compiled once per distinct text."""
    return ChatTemplate(source, dict(special_tokens))
