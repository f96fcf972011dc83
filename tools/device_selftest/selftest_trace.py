"""The self-test's reading of the scheduler's %globaltimer trace (structs.TRACE_PHASES), and the care it
takes so that one failing phase leaves the process usable for the next."""
from __future__ import annotations

import numpy as np
import torch

from blink.device import structs


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


PHASES = ("finish", "ingest", "plan", "inputs", "fence", "launch call")


def trace_stats(trace: np.ndarray, rows: int | None = None) -> dict[str, float]:
    """Over consecutive launches (optionally only decode steps of `rows` rows): control gap (next launch -
    completion seen), step period (launch to launch), in-graph time (launch to completion seen), and the
    gap's phases (p50 each, us): finish (completion seen -> records out), ingest (-> ring read), plan
    (-> step built, admissions written), inputs (-> step buffers written), fence (-> launch call), and
    the launch call itself (not part of the gap)."""
    launch, done = trace[:, 0], trace[:, 1]
    finish, ingest, plan, inputs, returned = (trace[:, k] for k in range(3, 8))
    n_tok, n_rows = structs.trace_step_sizes(trace)
    keep = np.ones(len(trace) - 1, bool) if rows is None else (
        (n_rows[:-1] == rows) & (n_tok[:-1] == rows) & (n_rows[1:] == rows) & (n_tok[1:] == rows))
    gap, period, run = (launch[1:] - done[:-1])[keep], (launch[1:] - launch[:-1])[keep], (done - launch)[:-1][keep]
    parts = [finish[:-1] - done[:-1], ingest[1:] - finish[:-1], plan[1:] - ingest[1:], inputs[1:] - plan[1:],
             launch[1:] - inputs[1:], returned[1:] - launch[1:]]
    out = {"n": int(keep.sum()), "gap50": pct(gap, 50) / 1e3, "gap99": pct(gap, 99) / 1e3,
           "period50": pct(period, 50) / 1e3, "run50": pct(run, 50) / 1e3,
           "ingest99": pct(parts[1][keep], 99) / 1e3, "ingest_max": float(parts[1][keep].max(initial=0)) / 1e3}
    for name, values in zip(PHASES, parts, strict=True):
        out[name] = pct(values[keep], 50) / 1e3
    return out


def phase_text(st: dict[str, float]) -> str:
    return " | ".join(f"{name} {st[name]:.2f}" for name in PHASES)


def arrival_gap_text(st: dict[str, float]) -> str:
    """Under arrivals: the gap's tail and the ingest phase's (requests taken in between forwards)."""
    return (f"gap p50 / p99 {st['gap50']:.2f} / {st['gap99']:.2f}; ingest phase p50 / p99 / max {st['ingest']:.2f} / "
            f"{st['ingest99']:.2f} / {st['ingest_max']:.2f} (n={st['n']})")


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
