"""The front end's CPU per streamed delta for shaping a chat answer (blink/frontend/chat_output.py): no
parser, a reasoning parser on plain content and on a long thought, auto tool calls and a forced call.

    .venv/bin/python tools/chat_output_cost.py [--deltas 128] [--repeats 15]

Prints, per case, the median and min-max over repeats of microseconds per delta (one token's text each),
and each case's ratio to the plain stream measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

from blink.frontend.chat_output import ChoiceStream, ReasoningPlan
from blink.frontend.tools import HERMES, plan_tools
from blink.request import Constraint
from blink.text.reasoning import reasoning_format

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _pieces(text: str, n: int) -> list[str]:
    """`text` repeated to n pieces of about a token each (4 characters)."""
    words = (text * (1 + 4 * n // len(text)))[:4 * n]
    return [words[i:i + 4] for i in range(0, 4 * n, 4)]


def cases(n: int) -> dict[str, tuple[ReasoningPlan | None, object, list[str]]]:
    prose = "The quick brown fox jumps over the lazy dog. "
    forced_plan = plan_tools(TOOLS, "required", None, HERMES)
    assert isinstance(forced_plan.constraint, Constraint)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + "Paris " * n + '"}}\n</tool_call>'
    return {
        "plain": (None, None, _pieces(prose, n)),
        "qwen3, no thought": (ReasoningPlan(reasoning_format("qwen3"), False), None, _pieces(prose, n)),
        "deepseek_r1, all thought": (ReasoningPlan(reasoning_format("deepseek_r1"), True), None, _pieces(prose, n)),
        "auto tools, prose": (None, plan_tools(TOOLS, "auto", None, HERMES), _pieces(prose, n)),
        "forced call": (None, forced_plan, _pieces(call, n)),
    }


def time_case(reasoning, tools, pieces: list[str]) -> float:
    """Seconds per delta for one stream."""
    start = time.perf_counter()
    stream = ChoiceStream(reasoning, tools)
    for piece in pieces[:-1]:
        stream.feed(piece)
    stream.finish(pieces[-1])
    return (time.perf_counter() - start) / len(pieces)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in cases(args.deltas)}
    for _ in range(args.repeats):  # interleaved, so drift hits every case alike
        for name, (reasoning, tools, pieces) in cases(args.deltas).items():
            runs[name].append(1e6 * min(time_case(reasoning, tools, pieces) for _ in range(20)))
    base = statistics.median(runs["plain"])
    for name, us in runs.items():
        med = statistics.median(us)
        print(f"{name:26s} {med:6.2f} us/delta [{min(us):.2f}-{max(us):.2f}]  {med / base:4.2f}x plain")


if __name__ == "__main__":
    main()
