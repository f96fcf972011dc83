"""Prometheus metrics of one front end, with vLLM's names under `blink:` and a `model_name` label.

Two sources, and nothing per token in the engine process in either mode:
- the front end's own observations of each request (arrival, the egress records it reads, the finish);
- the engine's control-block counters and gauges, read when /metrics is scraped (EngineCollector).
What each histogram measures exactly is written in its help text and in docs/api.md.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from blink.transport.layout import ITERATION_TOKEN_BOUNDS, STEP_INTERVAL_BOUNDS_NS

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10,
                   20, 40, 80)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
N_BUCKETS = (1, 2, 5, 10, 20, 50, 100)
GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
STALL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)  # loop lags, egress gaps


class EngineCollector:
    """Engine state from the control block at scrape time (its counters only grow: Prometheus counters)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.control = None  # set once the engine client is attached

    def collect(self):
        ctl = self.control
        if ctl is None:
            return
        labels = [self.model_name]

        def family(kind, name, doc, value):
            metric = kind(name, doc, labels=["model_name"])
            metric.add_metric(labels, value)
            return metric

        total = ctl.total_kv_blocks
        yield family(GaugeMetricFamily, "blink:num_requests_running", "Requests in the engine's running batch",
                     ctl.running)
        yield family(GaugeMetricFamily, "blink:num_requests_waiting", "Requests queued in the engine", ctl.waiting)
        yield family(GaugeMetricFamily, "blink:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)",
                     (total - ctl.free_kv_blocks) / total if total else 0.0)
        yield family(CounterMetricFamily, "blink:num_preemptions", "Preemptions in the engine (blocks ran out)",
                     ctl.preemptions)
        yield family(CounterMetricFamily, "blink:engine_steps", "Forward steps the engine ran", ctl.steps)
        yield family(CounterMetricFamily, "blink:engine_generated_tokens", "Tokens the engine sampled",
                     ctl.tokens)
        # vLLM's prefix_cache_queries / _hits, in tokens: prompt tokens looked up at admissions / found cached
        yield family(CounterMetricFamily, "blink:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                     ctl.prefix_cache_queries)
        yield family(CounterMetricFamily, "blink:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                     ctl.prefix_cache_hits)
        yield histogram_family("blink:iteration_tokens_total", "Tokens (prompt + generated) per engine step",
                               labels, map(str, ITERATION_TOKEN_BOUNDS), ctl.iteration_tokens,
                               ctl.iteration_tokens_sum)
        yield histogram_family("blink:engine_step_interval_seconds",
                               "Busy step intervals: one step's completion to the next's with no idle turn between, "
                               "on the engine's clock (the GPU's in device mode)", labels,
                               (f"{b / 1e9:g}" for b in STEP_INTERVAL_BOUNDS_NS), ctl.step_intervals,
                               ctl.step_intervals_sum_ns / 1e9)


def histogram_family(name: str, doc: str, labels: list[str], bounds, counts, total) -> HistogramMetricFamily:
    """A histogram from the engine's per-bucket counts (the last bucket unbounded), cumulated here."""
    cumulative, buckets = 0, []
    for bound, count in zip([*bounds, "+Inf"], list(counts), strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    metric = HistogramMetricFamily(name, doc, labels=["model_name"])
    metric.add_metric(labels, buckets, sum_value=total)
    return metric


class FrontendMetrics:
    def __init__(self, engine_pid: int | None, model_name: str = "blink"):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, m = self.registry, ["model_name"]

        def histogram(name, doc, buckets):
            return Histogram(name, doc, m, buckets=buckets, registry=r).labels(model_name)

        self.requests = Counter("blink:request_success", "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        self.prompt_tokens = Counter("blink:prompt_tokens", "Prompt tokens of finished requests", m,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter("blink:generation_tokens", "Generated tokens the front end received", m,
                                         registry=r).labels(model_name)
        self.ttft = histogram("blink:time_to_first_token_seconds",
                              "Request arrival (headers parsed) -> first token record read: the front end's "
                              "handling (body, validation, tokenization) + queue + prefill + transport",
                              LATENCY_BUCKETS)
        self.itl = histogram("blink:inter_token_latency_seconds",
                             "Between consecutive token records of a request, as the front end reads them",
                             LATENCY_BUCKETS)
        self.e2e = histogram("blink:e2e_request_latency_seconds", "Request arrival -> last record read",
                             LATENCY_BUCKETS)
        self.queue_time = histogram("blink:request_queue_time_seconds",
                                    "Engine ingest -> first admission to a step (measured by the engine)",
                                    LATENCY_BUCKETS)
        self.prefill_time = histogram("blink:request_prefill_time_seconds",
                                      "First admission -> first token record read: submission to the ring -> "
                                      "first token less the engine's queue time (prefill steps + egress transport)",
                                      LATENCY_BUCKETS)
        self.decode_time = histogram("blink:request_decode_time_seconds",
                                     "First token record -> last record of a request (the decode phase)",
                                     LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram("blink:request_prompt_tokens", "Prompt tokens per request",
                                               TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("blink:request_generation_tokens",
                                                   "Generated tokens per finished request", TOKEN_BUCKETS)
        self.params_n = histogram("blink:request_params_n", "The n parameter of each API request", N_BUCKETS)
        self.params_max_tokens = histogram("blink:request_params_max_tokens",
                                           "The max_tokens of each engine request", TOKEN_BUCKETS)
        self.engine_pid = Gauge("blink:engine_pid", "Process id of the engine", m, registry=r).labels(model_name)
        self.engine_pid.set(engine_pid or 0)
        self.gc_pause = Histogram("blink:frontend_gc_pause_seconds",
                                  "Each garbage collection of the front-end process (the GIL held: every stream "
                                  "waits), by generation", ["model_name", "generation"], buckets=GC_BUCKETS,
                                  registry=r)
        self.gc_frozen = Gauge("blink:frontend_gc_frozen_objects", "Startup objects frozen out of the collector "
                               "(--gc-freeze; 0: off)", m, registry=r).labels(model_name)
        # Whole-server pauses, attributed: the front end's loop blocked, or the engine silent
        self.loop_lag = histogram("blink:frontend_loop_lag_seconds",
                                  "Lateness of the front end's event-loop timer (20 ms tick, 250 ms idle): how long "
                                  "the loop could not run anything (every stream waits)", STALL_BUCKETS)
        self.egress_gap = histogram("blink:frontend_egress_gap_seconds",
                                    "While requests are in flight, the time between consecutive egress reads that "
                                    "returned records: the engine's silence as the front end sees it",
                                    STALL_BUCKETS)
        # Requests the front end holds before the engine sees them (not in num_requests_waiting): queued for the
        # tokenization pool, and waiting for a grammar arena partition. Read at scrape time (watch()).
        self.tokenization_jobs = Gauge("blink:frontend_tokenization_jobs", "Tokenization and detokenization jobs "
                                       "running or queued on the front end's worker pool", m,
                                       registry=r).labels(model_name)
        self.grammar_waiting = Gauge("blink:grammar_arena_waiting", "Requests waiting for a grammar arena partition "
                                     "(every one held by other constraints)", m, registry=r).labels(model_name)
        self.engine = EngineCollector(model_name)
        r.register(self.engine)

    def watch(self, text_workers, structured) -> None:
        """The gauges above read these objects' own counts whenever /metrics is scraped."""
        self.tokenization_jobs.set_function(lambda: text_workers.pending)
        self.grammar_waiting.set_function(lambda: structured.waiting)

    def gc_collected(self, generation: int, seconds: float) -> None:
        self.gc_pause.labels(self.model_name, str(generation)).observe(seconds)

    def render(self, control) -> bytes:
        """The exposition text; the engine's part is read from the control block now."""
        self.engine.control = control
        return generate_latest(self.registry)

    def finished(self, reason: str) -> None:
        self.requests.labels(self.model_name, reason).inc()


class RequestTimer:
    """Feeds the per-request series for one engine request, from the records the front end reads.

    TTFT and E2E start at `arrival` (the HTTP request's, perf_counter; default: now, the submission), so
    they hold what the front end spends before it submits (body, validation, tokenization); the prefill
    time starts at the submission, so queue + prefill is the engine path alone.
    """

    def __init__(self, metrics: FrontendMetrics, num_prompt_tokens: int, max_tokens: int,
                 arrival: float | None = None):
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.submitted = self.last = time.perf_counter()
        self.arrival = self.submitted if arrival is None else arrival
        self.first = None
        self.num_tokens = 0
        metrics.params_max_tokens.observe(max_tokens)

    def token(self, queue_us: int = 0) -> None:
        """One token record read; the first one carries the engine's queue time."""
        now = time.perf_counter()
        if self.num_tokens == 0:
            queue = queue_us * 1e-6
            self.metrics.ttft.observe(now - self.arrival)
            self.metrics.queue_time.observe(queue)
            self.metrics.prefill_time.observe(max(0.0, now - self.submitted - queue))
            self.first = now
        else:
            self.metrics.itl.observe(now - self.last)
        self.last = now
        self.num_tokens += 1
        self.metrics.generation_tokens.inc()

    def finish(self, finish_reason: str) -> None:
        m = self.metrics
        m.finished(finish_reason)
        m.prompt_tokens.inc(self.num_prompt_tokens)
        m.request_prompt_tokens.observe(self.num_prompt_tokens)
        m.request_generation_tokens.observe(self.num_tokens)
        now = time.perf_counter()
        m.e2e.observe(now - self.arrival)
        if self.first is not None:
            m.decode_time.observe(now - self.first)
