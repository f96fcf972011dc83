"""The self-test's reading of the scheduler's %globaltimer trace (structs.TRACE_PHASES), and the care it
takes so that one failing phase leaves the process usable for the next."""
from __future__ import annotations

import numpy as np
import torch

from blink.device import structs


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


PHASES = ("finish", "ingest", "plan", "inputs", "fence", "launch call")
# the finish's and the plan's parts (trace words 8-10): rows advanced, frees done, the rest (records staged, metrics);
# scheduled, then admissions written
PARTS = ("rows", "frees", "records", "schedule", "admissions")


def trace_stats(trace: np.ndarray, rows: int | None = None) -> dict[str, float]:
    """Over consecutive launches (optionally only decode steps of `rows` rows): control gap (next launch -
    completion seen), step period (launch to launch), in-graph time (launch to completion seen), and the
    gap's phases (p50 each, us): finish (completion seen -> step finished; its parts: rows advanced, frees
    done, the rest), ingest (-> ring read), plan (-> step built, admissions written; its parts: scheduled,
    admissions), inputs (-> step buffers written), fence (-> launch call), and the launch call itself (not
    part of the gap)."""
    col = {name: trace[:, k] for k, name in enumerate(structs.TRACE_PHASES)}
    launch, done, finish = col["launch"], col["done"], col["finish"]
    n_tok, n_rows = structs.trace_step_sizes(trace)
    keep = np.ones(len(trace) - 1, bool) if rows is None else (
        (n_rows[:-1] == rows) & (n_tok[:-1] == rows) & (n_rows[1:] == rows) & (n_tok[1:] == rows))
    ahead = keep & (col["ahead"][1:] != 0)  # launched ahead: the gap is the check, the fence and the launch call
    sync = keep & ~ahead
    gap_all = launch[1:] - done[:-1]
    gap, period, run = gap_all[keep], (launch[1:] - launch[:-1])[keep], (done - launch)[:-1][keep]
    parts = [finish[:-1] - done[:-1], col["ingest"][1:] - finish[:-1], col["plan"][1:] - col["ingest"][1:],
             col["inputs"][1:] - col["plan"][1:], launch[1:] - col["inputs"][1:], col["launched"][1:] - launch[1:]]
    inner = [col["rows"][:-1] - done[:-1], col["frees"][:-1] - col["rows"][:-1], finish[:-1] - col["frees"][:-1],
             col["scheduled"][1:] - col["ingest"][1:], col["plan"][1:] - col["scheduled"][1:]]
    out = {"n": int(keep.sum()), "gap50": pct(gap, 50) / 1e3, "gap99": pct(gap, 99) / 1e3,
           "period50": pct(period, 50) / 1e3, "run50": pct(run, 50) / 1e3,
           "ingest99": pct(parts[1][sync], 99) / 1e3, "ingest_max": float(parts[1][sync].max(initial=0)) / 1e3,
           "n_ahead": int(ahead.sum()), "ahead_gap50": pct(gap_all[ahead], 50) / 1e3,
           "check": pct((col["inputs"][1:] - done[:-1])[ahead], 50) / 1e3,
           "check_rows": pct((col["scheduled"][1:] - done[:-1])[ahead], 50) / 1e3,
           "ahead_fence": pct(parts[4][ahead], 50) / 1e3, "ahead_launch": pct(parts[5][ahead], 50) / 1e3}
    for name, values in zip(PHASES + PARTS, parts + inner, strict=True):
        out[name] = pct(values[sync], 50) / 1e3  # the synchronous path's steps
    return out


def phase_text(st: dict[str, float]) -> str:
    """The synchronous steps' phases, then (if any) the steps launched ahead: their gap is check + fence."""
    text = {name: f"{name} {st[name]:.2f}" for name in PHASES}
    text["finish"] += f" (rows {st['rows']:.2f}, frees {st['frees']:.2f}, records {st['records']:.2f})"
    text["plan"] += f" (schedule {st['schedule']:.2f}, admissions {st['admissions']:.2f})"
    out = " | ".join(text[name] for name in PHASES)
    if st["n_ahead"]:
        out += (f" || ahead {st['n_ahead']} of {st['n']}: gap {st['ahead_gap50']:.2f} = check {st['check']:.2f}"
                f" (rows {st['check_rows']:.2f}) + fence {st['ahead_fence']:.2f}; launch call {st['ahead_launch']:.2f}")
    return out


def arrival_gap_text(st: dict[str, float]) -> str:
    """Under arrivals: the gap's tail and the ingest phase's (requests taken in between forwards)."""
    return (f"gap p50 / p99 {st['gap50']:.2f} / {st['gap99']:.2f}; ingest phase p50 / p99 / max {st['ingest']:.2f} / "
            f"{st['ingest99']:.2f} / {st['ingest_max']:.2f} (n={st['n']}, {st['n_ahead']} launched ahead: gap p50 "
            f"{st['ahead_gap50']:.2f})")


def shutdown_quietly(engine) -> None:
    """Free an engine whose loop may have failed: report, never raise (the next phase must still run)."""
    try:
        engine.shutdown()
    except Exception as e:
        print(f"shutdown after the phase: {type(e).__name__}: {e}", flush=True)


def context_healthy() -> str | None:
    """None if the CUDA context still works, else why not (a kernel fault poisons the whole context)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
