"""Prometheus metrics of one front end (its own registry: no process-global collectors)."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10,
                   20, 40, 80)


class FrontendMetrics:
    def __init__(self, engine_pid: int | None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("blink_requests", "Finished requests by finish reason", ["finish_reason"],
                                registry=r)
        self.prompt_tokens = Counter("blink_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("blink_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("blink_time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("blink_inter_token_latency_seconds", "Time between tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("blink_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("blink_num_requests_running", "Requests the engine is running", registry=r)
        self.waiting = Gauge("blink_num_requests_waiting", "Requests waiting in the engine", registry=r)
        self.kv_usage = Gauge("blink_kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)", registry=r)
        self.engine_steps = Gauge("blink_engine_steps", "Engine steps so far", registry=r)
        self.engine_tokens = Gauge("blink_engine_generated_tokens", "Tokens the engine generated", registry=r)
        self.preemptions = Gauge("blink_engine_preemptions", "Preemptions in the engine", registry=r)
        self.engine_pid = Gauge("blink_engine_pid", "Process id of the engine", registry=r)
        # vLLM's prefix_cache_queries / _hits: prompt tokens looked up at admissions / found cached
        self.prefix_queries = Counter("blink_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("blink_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                   registry=r)
        self._prefix_seen = (0, 0)  # the engine's totals at the last render
        self.engine_pid.set(engine_pid or 0)

    def render(self, control) -> bytes:
        """The exposition text, with the engine gauges read from the control block now."""
        if control is not None:
            self.running.set(control.running)
            self.waiting.set(control.waiting)
            total = control.total_kv_blocks
            self.kv_usage.set((total - control.free_kv_blocks) / total if total else 0.0)
            self.engine_steps.set(control.steps)
            self.engine_tokens.set(control.tokens)
            self.preemptions.set(control.preemptions)
            queries, hits = int(control.prefix_cache_queries), int(control.prefix_cache_hits)
            self.prefix_queries.inc(max(0, queries - self._prefix_seen[0]))
            self.prefix_hits.inc(max(0, hits - self._prefix_seen[1]))
            self._prefix_seen = (queries, hits)
        return generate_latest(self.registry)


class RequestTimer:
    """Feeds TTFT / ITL / end-to-end latency for one request."""

    def __init__(self, metrics: FrontendMetrics, num_prompt_tokens: int):
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = self.last = time.perf_counter()
        self.num_tokens = 0

    def token(self) -> None:
        now = time.perf_counter()
        (self.metrics.ttft if self.num_tokens == 0 else self.metrics.itl).observe(now - self.last)
        self.last = now
        self.num_tokens += 1
        self.metrics.generation_tokens.inc()

    def finish(self, finish_reason: str) -> None:
        self.metrics.requests.labels(finish_reason=finish_reason).inc()
        self.metrics.prompt_tokens.inc(self.num_prompt_tokens)
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)
