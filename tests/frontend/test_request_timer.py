"""Where the server's TTFT clock starts: at the request's arrival (RequestIdMiddleware), not at the
submission to the ring, so blink:time_to_first_token_seconds holds the front end's own handling."""
from __future__ import annotations

import asyncio
import time

from blink.frontend.metrics import FrontendMetrics, RequestTimer
from blink.frontend.middleware import RequestIdMiddleware


def _sum(metrics: FrontendMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name + "_sum", {"model_name": "m"})


def test_ttft_and_e2e_start_at_arrival_prefill_at_submission():
    metrics = FrontendMetrics(None, "m")
    timer = RequestTimer(metrics, num_prompt_tokens=4, max_tokens=2, arrival=time.perf_counter() - 1.0)
    timer.token(queue_us=0)
    timer.token()
    timer.finish("length")
    assert _sum(metrics, "blink:time_to_first_token_seconds") >= 1.0  # the second before the submission counts
    assert _sum(metrics, "blink:e2e_request_latency_seconds") >= 1.0
    assert _sum(metrics, "blink:request_prefill_time_seconds") < 1.0  # the engine path alone


def test_without_an_arrival_the_clock_starts_at_submission():
    metrics = FrontendMetrics(None, "m")
    before = time.perf_counter()
    timer = RequestTimer(metrics, num_prompt_tokens=4, max_tokens=1)
    assert before <= timer.arrival == timer.submitted


def test_the_middleware_stamps_the_arrival_before_the_app_runs():
    seen = {}

    async def app(scope, receive, send):
        seen["arrival"], seen["at_app"] = scope["state"]["arrival"], time.perf_counter()

    async def main():
        before = time.perf_counter()
        scope = {"type": "http", "headers": [], "path": "/v1/completions", "method": "POST"}
        await RequestIdMiddleware(app)(scope, None, None)
        return before

    before = asyncio.run(main())
    assert before <= seen["arrival"] <= seen["at_app"]
