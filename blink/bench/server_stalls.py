"""The server's stalls during a point, from its /metrics, read before and after the point (the difference is
the point's):

- its garbage collections (blink:frontend_gc_pause_seconds), count and seconds per generation;
- its event loop's lags (blink:frontend_loop_lag_seconds: the loop could not run anything) and the engine's
  silences while requests were in flight (blink:frontend_egress_gap_seconds), as histogram bucket counts:
  how many were over 50 and 100 ms, and the bound of the highest bucket reached (an upper bound on the
  longest). Together they tell a whole-server pause (blink/bench/pauses.py) of a blocked front end from one
  of a silent engine;
- the engine's busy step intervals (blink:engine_step_interval_seconds, from the control block: on the GPU's
  clock in device mode): an engine that really stalled shows here, a front end that stopped reading does not;
- the engine's steps, generated tokens and preemptions (blink:engine_steps, blink:engine_generated_tokens,
  blink:num_preemptions): tokens per step and energy per step, beside energy per token (a faster engine at a
  fixed rate runs more, smaller steps), and whether the KV pool ran out (a preempted stream waits for its
  recompute, a gap no step interval shows).

A server without a series (the HF peer; a blink before 2026-12-01 session 9 for the collections, before
session 10 for the stalls) gives None for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

SERIES = "blink:frontend_gc_pause_seconds"
STALL_SERIES = {"loop_lag": "blink:frontend_loop_lag_seconds", "egress_gap": "blink:frontend_egress_gap_seconds",
                "engine_interval": "blink:engine_step_interval_seconds"}
OVER_S = {"over_50ms": 0.05, "over_100ms": 0.1}
ENGINE_COUNTERS = {"steps": "blink:engine_steps", "generated_tokens": "blink:engine_generated_tokens",
                   "preemptions": "blink:num_preemptions"}


@dataclass(frozen=True)
class ServerReading:
    """One scrape: the collections' totals, the stall histograms' cumulative buckets ({le: count}) and the
    engine's step and token counters."""

    gc: dict[str, float] | None
    stalls: dict[str, dict[str, float] | None] | None
    engine: dict[str, float] | None = None


def metric_families(base_url: str) -> list | None:
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return list(text_string_to_metric_families(response.text))


def gc_totals(families: list | None) -> dict[str, float] | None:
    """{"gen<G>_count": n, "gen<G>_seconds": s} summed over the process's life, or None without the series
    ({} with it but no collection yet)."""
    totals: dict[str, float] | None = None
    for family in families or ():
        if family.name != SERIES:
            continue
        totals = totals or {}
        for sample in family.samples:
            suffix = {SERIES + "_count": "count", SERIES + "_sum": "seconds"}.get(sample.name)
            if suffix:
                key = f"gen{sample.labels['generation']}_{suffix}"
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def stall_buckets(families: list | None) -> dict[str, dict[str, float] | None] | None:
    """{"loop_lag": {le: cumulative count}, "egress_gap": ..., "engine_interval": ...} (each None without its
    series), summed over the labels; None without any of them."""
    found: dict[str, dict[str, float] | None] = dict.fromkeys(STALL_SERIES)
    by_name = {series: key for key, series in STALL_SERIES.items()}
    for family in families or ():
        key = by_name.get(family.name)
        if key is None:
            continue
        buckets = found[key] = found[key] or {}
        for sample in family.samples:
            if sample.name == family.name + "_bucket":
                le = sample.labels["le"]
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return found if any(v is not None for v in found.values()) else None


def engine_counters(families: list | None) -> dict[str, float] | None:
    """{"steps": n, "generated_tokens": n, "preemptions": n} over the engine's life (the control block's
    counters), or None without steps or tokens (preemptions may be missing: a point then has none of them)."""
    by_name = {series: key for key, series in ENGINE_COUNTERS.items()}
    found = {by_name[f.name]: sum(x.value for x in f.samples) for f in families or () if f.name in by_name}
    return found if "steps" in found and "generated_tokens" in found else None


def read_server(base_url: str) -> ServerReading:
    families = metric_families(base_url)
    return ServerReading(gc_totals(families), stall_buckets(families), engine_counters(families))


def engine_delta(before: dict | None, after: dict | None) -> dict | None:
    """The point's engine steps, generated tokens, their ratio (tokens per step) and preemptions, or None."""
    if before is None or after is None:
        return None
    steps, tokens = after["steps"] - before["steps"], after["generated_tokens"] - before["generated_tokens"]
    delta = {"steps": steps, "generated_tokens": tokens, "tokens_per_step": tokens / steps if steps else None}
    if "preemptions" in before and "preemptions" in after:
        delta["preemptions"] = after["preemptions"] - before["preemptions"]
    return delta


def gc_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: round(v - before.get(k, 0.0), 6) for k, v in sorted(after.items())}


def histogram_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """One stall series over the point: {"count", "over_50ms", "over_100ms", "longest_le", "buckets"}.

    `buckets` holds the point's cumulative counts by bound (Prometheus' `le` labels); `over_X` counts the
    observations above the largest bound <= X (exactly those over X with blink's buckets); `longest_le` is
    the bound of the lowest bucket holding every observation, as Prometheus writes it ("0.25"; "+Inf" past
    the last one): an upper bound on the longest. None when nothing was observed.
    """
    ordered = sorted(after, key=float)
    buckets = {le: round(after[le] - before.get(le, 0.0)) for le in ordered}  # counts: whole numbers
    count = buckets.get("+Inf", 0)
    delta = {"count": count}
    for name, limit in OVER_S.items():
        below = [n for le, n in buckets.items() if float(le) <= limit]
        delta[name] = count - (below[-1] if below else 0)
    delta["longest_le"] = next((le for le, n in buckets.items() if n >= count), None) if count else None
    delta["buckets"] = buckets
    return delta


def stall_delta(before: dict | None, after: dict | None) -> dict | None:
    """The point's stalls per series (histogram_delta; None for a series either scrape lacks), or None."""
    if before is None or after is None:
        return None
    return {key: histogram_delta(before[key], after[key])
            if before.get(key) is not None and after.get(key) is not None else None for key in STALL_SERIES}
