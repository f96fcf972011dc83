"""Where an offline run's steps spent their time, by kind: steps that carry prefill chunks (mixed, with or without
decodes) against pure decode steps, each against its roofline floor. Issue 17: `blink bench offline` stayed at 0.71
of its bound while batch-1 decode got 13% faster, and the run's total cannot say which kind holds the gap."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from blink.bench.roofline import ModelShape
from blink.core.interface import StepTime


@dataclass(frozen=True)
class KindSplit:
    kind: str  # "prefill" (the step carries a prompt chunk) or "decode" (one token a sequence)
    steps: int
    seconds: float  # the steps' summed durations
    floor_s: float  # their summed roofline floors
    median_ms: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.floor_s if self.floor_s else float("nan")


def step_floor_s(step: StepTime, shape: ModelShape, input_len: int, output_len: int) -> float:
    """A step's floor under the offline workload's own model (offline.workload_floor_s): a prefill step's tokens
    as whole prompts' chunks (half their KV read, the causal pairs of full prompts), a decode step's rows at the
    context halfway through the outputs."""
    if step.num_tokens == step.num_seqs:
        return shape.decode_floor_s(step.num_seqs, input_len + output_len // 2)
    t = step.num_tokens
    return shape.step_floor_s(t, t // 2, t * (input_len + 1) // 2)


def split_steps(steps: list[StepTime], shape: ModelShape, input_len: int, output_len: int) -> list[KindSplit]:
    """One KindSplit per kind present, prefill first."""
    out = []
    for kind, is_kind in [("prefill", lambda s: s.num_tokens > s.num_seqs),
                          ("decode", lambda s: s.num_tokens == s.num_seqs)]:
        mine = [s for s in steps if is_kind(s)]
        if mine:
            out.append(KindSplit(kind, len(mine), sum(s.seconds for s in mine),
                                 sum(step_floor_s(s, shape, input_len, output_len) for s in mine),
                                 statistics.median(s.seconds for s in mine) * 1e3))
    return out


def last_run_steps(times: list[StepTime], steps_run: int) -> list[StepTime]:
    """The run's steps from an engine's step_times() after it: the last steps_run (engine stats' step count over
    the run). Device mode lists a launch only once the next one starts, so its list lacks the run's last step and
    may lead with the step before the run (a warm-up's)."""
    return times[-steps_run:] if steps_run > 0 else []


def format_split(splits: list[KindSplit], wall_s: float) -> str:
    lines = []
    for k in splits:
        lines.append(f"  {k.kind:<8} {k.steps:5d} steps {k.seconds * 1e3:9.1f} ms (median {k.median_ms:.3f} ms a step)"
                     f"  floor {k.floor_s * 1e3:9.1f} ms  ratio {k.ratio:.2f}")
    stepped = sum(k.seconds for k in splits)
    lines.append(f"  steps {stepped * 1e3:.1f} of the run's {wall_s * 1e3:.1f} ms; the rest is between steps "
                 "(admission, idle polls, the drain)")
    return "\n".join(lines)
