"""Incremental detokenization and stop strings: text deltas that, joined, equal the full decode.

Decoding a token on its own is wrong in two ways: a multi-byte UTF-8 character split over tokens decodes
to U+FFFD, and SentencePiece-style decoders drop the leading space of the first token they see. So each
step decodes a short window that starts a few tokens back (`prefix_offset`), and compares it with the
same window without the new tokens; the difference is the new text, held back while it ends in U+FFFD.
"""
from __future__ import annotations

from blink.text.tokenizer import ModelTokenizer

CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first output tokens
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: ModelTokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        self.ids = context
        self.prefix_offset = 0
        self.read_offset = len(context)

    def add(self, token_id: int) -> str:
        """Append one token; returns the text it completes (possibly empty while a character is split)."""
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the request: whatever is still held back (a split character shows as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        delta = full_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""


def held_back(text: str, tags) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `tags`: what a stream holds back
    while a stop string, a tool call's opening tag or a reasoning block's closing tag may be starting."""
    for length in range(min(max(map(len, tags), default=0) - 1, len(text)), 0, -1):
        tail = text[-length:]
        if any(t.startswith(tail) for t in tags):
            return length
    return 0


class StopStringMatcher:
    """Finds the first stop string in streamed text and holds back any tail that may begin one.

    `feed(delta)` returns (text safe to emit now, stopped). Once stopped, everything after the stop string
    is dropped, and the stop string too unless `include_stop` (OpenAI leaves it out).
    """

    def __init__(self, stop: list[str], include_stop: bool = False):
        self.stop = [s for s in stop if s]
        self.include_stop = include_stop  # vLLM's include_stop_str_in_output: emit the stop string too
        self.longest = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (stop_reason)

    def feed(self, delta: str, check: bool = True) -> tuple[str, bool]:
        """`check=False` appends without looking for stops (vLLM skips them before min_tokens)."""
        if self.stopped:
            return "", True
        search_from = max(0, len(self.text) - self.longest + 1)
        self.text += delta
        if not self.stop:
            return self._emit_until(len(self.text)), False
        if check:
            hits = [(i, s) for i, s in ((self.text.find(s, search_from), s) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                start, self.matched = min(hits, key=lambda hit: hit[0])
                return self._emit_until(start + len(self.matched) if self.include_stop else start), True
        return self._emit_until(len(self.text) - held_back(self.text, self.stop)), False

    def flush(self) -> str:
        """The held-back tail, at the end of a request that did not stop on a string."""
        return "" if self.stopped else self._emit_until(len(self.text))

    def _emit_until(self, end: int) -> str:
        end = max(end, self.emitted)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
