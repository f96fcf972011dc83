"""Per-request timings and the summary statistics of a serving benchmark, with vLLM's definitions.

- TTFT: time from sending the request to the first streamed token.
- TPOT (per request): (E2E latency - TTFT) / (output tokens - 1), only for requests with more than one
  output token; the summary is over those requests.
- ITL: the gaps between consecutive streamed chunks, pooled over all requests.
- E2EL: time from sending the request to its last byte.
Percentiles interpolate linearly (numpy's default); an empty sample reports 0, as vLLM does.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (90, 99)  # plus the median, always reported
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
FAILURE_REASONS = 3  # the commonest errors kept in a summary, with their counts


@dataclass
class RequestResult:
    """What one request produced, as the client saw it. Times are seconds."""

    success: bool = False
    prompt_len: int = 0  # the server's usage.prompt_tokens when it reports one, else the dataset's count
    output_tokens: int = 0  # the server's usage.completion_tokens when it reports one, else chunks seen
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (prefix cache), 0 when not reported
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0  # perf_counter when the request was sent
    error: str = ""
    generated_text: str = ""
    streamed_tokens: int = 0  # token chunks received so far: what a request cancelled at the drain deadline did

    @property
    def tokens_received(self) -> int:
        """Output tokens that reached the client (all of a finished request's; the chunks of a cut one)."""
        return max(self.output_tokens, self.streamed_tokens)

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def percentile_stats(name: str, values_s: list[float]) -> dict[str, float]:
    """mean_/median_/std_/pNN_ `name`_ms for a sample given in seconds."""
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    if ms.size == 0:
        ms = np.zeros(1)
    stats = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in PERCENTILES:
        stats[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return stats


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    """The result dictionary of a benchmark run (vLLM's field names)."""
    done = [r for r in results if r.success]
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_tokens for r in done)
    samples = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.tpot is not None],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.latency for r in done],
    }
    duration = max(duration_s, 1e-9)
    summary = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(results) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "total_cached_tokens": sum(r.cached_tokens for r in done),
        "prefix_cache_hit_rate": sum(r.cached_tokens for r in done) / total_input if total_input else 0.0,
        "request_throughput": len(done) / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        # why requests failed, the commonest first: a failed count alone sent a GPU session to guess (2026-12-05)
        "failure_reasons": Counter(r.error for r in results if not r.success).most_common(FAILURE_REASONS),
    }
    for name in LATENCY_METRICS:
        summary.update(percentile_stats(name, samples[name]))
    return summary


def per_request_details(results: list[RequestResult]) -> dict[str, list]:
    """The per-request lists vLLM writes with --save-detailed."""
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_tokens for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "e2els": [r.latency for r in results],
        "errors": [r.error for r in results],
    }
