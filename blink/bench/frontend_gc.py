"""The front end's garbage collections during a point, from its /metrics (blink:frontend_gc_pause_seconds):
read before and after, the difference per generation. A server without the series (the HF peer, a blink
before 2026-12-01 session 9) gives None."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

SERIES = "blink:frontend_gc_pause_seconds"


def read_gc_totals(base_url: str) -> dict[str, float] | None:
    """{"gen<G>_count": n, "gen<G>_seconds": s} summed over the process's life, or None."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name != SERIES:
            continue
        for sample in family.samples:
            suffix = {SERIES + "_count": "count", SERIES + "_sum": "seconds"}.get(sample.name)
            if suffix:
                key = f"gen{sample.labels['generation']}_{suffix}"
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals or None


def gc_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: round(v - before.get(k, 0.0), 6) for k, v in sorted(after.items())}
