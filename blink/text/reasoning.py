"""Reasoning parsers (vLLM's and SGLang's `--reasoning-parser`): a thinking model's output split into its
reasoning (the `<think>` block) and its content.

One state machine serves a whole output and a stream of deltas, so a stream's pieces always join to the
unstreamed answer. Per request, on the front end: nothing here runs in the engine.

The rule, for both formats:
- The output begins inside the block when the format always thinks (DeepSeek-R1: its template opens the
  block in the prompt, or the model omits the tag) or when the prompt ends with the opening tag (Qwen3's
  thinking-only templates); otherwise it begins in content.
- A `<think>` at the very start (after whitespace) opens the block either way; the tag is dropped.
- Inside the block everything up to `</think>` is reasoning; the tag and the whitespace after it are
  dropped, and the rest is content. A block that never closes is all reasoning (no content).
- Tags later in the content are content.
"""
from __future__ import annotations

from dataclasses import dataclass

from blink.grammar.reasoning import reasoned_constraint
from blink.request import Constraint
from blink.text.detokenizer import held_back

_START, _THINK, _AFTER, _CONTENT = range(4)
OPEN, SKIPPED, BY_MODEL = "open", "skipped", "by_model"  # ReasoningFormat.thought_at


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    open_tag: str = "<think>"
    close_tag: str = "</think>"
    always_thinks: bool = False

    def thought_at(self, prompt_text: str) -> str:
        """Where a prompt leaves the thought: OPEN (the output begins inside it), SKIPPED (the prompt wrote
        a closed block, as Qwen3's template does for enable_thinking=false) or BY_MODEL (the model opens it).
        Only the prompt's end counts: a user may well write the tags in a message."""
        end = prompt_text.rstrip()
        if self.always_thinks or end.endswith(self.open_tag):
            return OPEN
        return SKIPPED if end.endswith(self.close_tag) else BY_MODEL

    def constrain(self, inner: Constraint, thought: str) -> Constraint:
        """`inner` applied after the thought, which stays free text (blink/grammar/reasoning.py); a prompt
        that skipped the thought gets `inner` alone."""
        if thought == SKIPPED:
            return inner
        return reasoned_constraint(inner, self.open_tag, self.close_tag, starts_open=thought == OPEN)


REASONING_FORMATS = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", always_thinks=True),  # DeepSeek-R1 and QwQ
    "qwen3": ReasoningFormat("qwen3"),  # Qwen3: thinks unless enable_thinking=false closed the block
}
_ALIASES = {"deepseek-r1": "deepseek_r1"}  # SGLang's spelling


def reasoning_format(name: str) -> ReasoningFormat:
    """The format a `--reasoning-parser` name stands for; ValueError names the known ones."""
    fmt = REASONING_FORMATS.get(_ALIASES.get(name, name))
    if fmt is None:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(REASONING_FORMATS)}")
    return fmt


class ReasoningSplitter:
    """feed() the output as it comes, then finish(); each returns (reasoning, content) ready to send."""

    def __init__(self, fmt: ReasoningFormat, starts_thinking: bool):
        self.fmt = fmt
        self.starts_thinking = starts_thinking
        self.state = _START
        self.held = ""
        self.reasoned = False  # the output had a reasoning block (reasoning is null otherwise)
        self.closed = False  # ... and it was closed (content is null when it was not)

    def _enter(self, state: int) -> None:
        self.state = state
        self.reasoned = self.reasoned or state == _THINK

    def feed(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning, content = [], []
        while self.held:
            if self.state == _START:
                head = self.held.lstrip()
                if head.startswith(self.fmt.open_tag):
                    self.held = head[len(self.fmt.open_tag):]
                    self._enter(_THINK)
                elif self.fmt.open_tag.startswith(head):
                    break  # whitespace, or the opening tag may be starting
                else:
                    self._enter(_THINK if self.starts_thinking else _CONTENT)
            elif self.state == _THINK:
                at = self.held.find(self.fmt.close_tag)
                if at >= 0:
                    reasoning.append(self.held[:at])
                    self.held = self.held[at + len(self.fmt.close_tag):]
                    self.closed = True
                    self._enter(_AFTER)
                    continue
                cut = len(self.held) - held_back(self.held, (self.fmt.close_tag,))
                reasoning.append(self.held[:cut])
                self.held = self.held[cut:]
                break
            elif self.state == _AFTER:  # the whitespace between the block and the answer is dropped
                self.held = self.held.lstrip()
                if self.held:
                    self._enter(_CONTENT)
            else:
                content.append(self.held)
                self.held = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held once the output is complete."""
        if self.state == _START:
            self._enter(_THINK if self.starts_thinking else _CONTENT)
        rest, self.held = self.held, ""
        if self.state == _THINK:
            return rest, ""
        return "", ("" if self.state == _AFTER else rest)


def split_reasoning(fmt: ReasoningFormat, text: str, starts_thinking: bool) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole output: reasoning None without a block, content None when the block
    never closed or nothing follows it (vLLM's nulls)."""
    splitter = ReasoningSplitter(fmt, starts_thinking)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    if not splitter.reasoned:
        return None, c1 + c2
    return r1 + r2, (c1 + c2) or None
