"""A constraint that lets a reasoning model think first: free text up to the close tag, then the real grammar.

vLLM applies structured outputs only after its --reasoning-parser sees the end of the thought; blink says the
same thing as one regex, so the DFA, the tables and the GPU masking need no change:

    starts_open (the chat template already opened the thought):  R CLOSE WS (INNER)
    otherwise (the model opens it itself):                        OPEN R CLOSE WS (INNER)

The thought is not optional: outlines-core took 27 s to build `(?:OPEN R CLOSE WS)?(INNER)` for a
json_object inner (1.0-1.3 s for the two forms above, 4.6 s for the inner alone; demo vocabulary, this
machine). A prompt that closes the thought itself (Qwen3 with enable_thinking=false) gets INNER alone.

R is any text (newlines included) that does not contain CLOSE, so the first CLOSE ends the thought; WS is
a bounded run of spaces and newlines (a model writes "</think>\\n\\n", and an unbounded run would let a
random-weights model pad forever).
"""
from __future__ import annotations

import json

from blink.grammar.schema import literal, literal_char
from blink.request import Constraint

WS = r"[ \n]{0,2}"
def _check_close(close_tag: str) -> None:
    if not close_tag:
        raise ValueError("the close tag must not be empty")
    if close_tag[0] in close_tag[1:]:
        raise ValueError(f"the close tag's first character {close_tag[0]!r} must not occur again in it")


def text_before(close_tag: str) -> str:
    """A regex for exactly the strings that do not contain close_tag (= c0 t1 .. t(m-1)).

    A KMP automaton: state k = the last k characters match the tag's first k. As c0 does not recur in the
    tag, a mismatch in state k >= 1 goes to state 1 on c0 and to state 0 on anything else. Unrolled:
      L = ((t1(t2(..t(m-2))?)?)? c0)*          from state 1 back to state 1
      E = [^t1 c0] | t1([^t2 c0] | t2(..))    from state 1 down to state 0
      R = ([^c0] | c0 L E)* (c0 L (t1(t2(..t(m-2))?)?)?)?   ends in state 0, or part way in (1..m-1)
    """
    _check_close(close_tag)
    c0, rest = literal_char(close_tag[0]), close_tag[1:]
    if not rest:  # a one-character tag: anything but it
        return f"[^{c0}]*"
    t = [literal_char(ch) for ch in rest]
    prefix = ""  # (t1(t2(..t(m-2))?)?)?: the partial matches past state 1 that stop short of the tag
    for ch in reversed(t[:-1]):
        prefix = f"(?:{ch}{prefix})?"
    loop = f"(?:{prefix}{c0})*"
    fall = f"[^{t[-1]}{c0}]"
    for ch in reversed(t[:-1]):
        fall = f"(?:[^{ch}{c0}]|{ch}{fall})"
    return f"(?:[^{c0}]|{c0}{loop}{fall})*(?:{c0}{loop}{prefix})?"


def reasoned_constraint(inner: Constraint, open_tag: str, close_tag: str, starts_open: bool) -> Constraint:
    """`inner` after a thought between open_tag and close_tag (spec: JSON, sorted keys, so equal requests
    share one cache entry)."""
    if inner.kind == "reasoned":
        raise ValueError("a reasoned constraint cannot wrap another")
    if not open_tag:
        raise ValueError("the open tag must not be empty")
    _check_close(close_tag)
    return Constraint("reasoned", json.dumps({"inner": {"kind": inner.kind, "spec": inner.spec}, "open": open_tag,
                                              "close": close_tag, "starts_open": bool(starts_open)},
                                             sort_keys=True))


def parse_reasoned(spec_text: str) -> tuple[Constraint, str, str, bool]:
    """(inner, open, close, starts_open) of a "reasoned" spec; ValueError on anything malformed."""
    try:
        spec = json.loads(spec_text)
        inner = spec["inner"]
        c = Constraint(inner["kind"], inner["spec"])
        open_tag, close_tag, starts_open = spec["open"], spec["close"], spec["starts_open"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"malformed reasoned constraint: {e}") from None
    if not (isinstance(c.spec, str) and isinstance(open_tag, str) and isinstance(close_tag, str)
            and isinstance(starts_open, bool)):
        raise ValueError("malformed reasoned constraint: wrong field types")
    reasoned_constraint(c, open_tag, close_tag, starts_open)  # the same refusals as at construction
    return c, open_tag, close_tag, starts_open


def reasoned_regex(open_tag: str, close_tag: str, starts_open: bool, inner_regex: str) -> str:
    thought = text_before(close_tag) + literal(close_tag) + WS
    if starts_open:
        return f"{thought}({inner_regex})"
    return f"{literal(open_tag)}{thought}({inner_regex})"
