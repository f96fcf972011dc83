"""Send a workload to an OpenAI-compatible server on an arrival schedule and summarise what came back."""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass

import aiohttp
import httpx
from tqdm.auto import tqdm

from blink.bench.client import completion_payload, stream_completion
from blink.bench.client_stalls import ClientStallRecorder, collector_held
from blink.bench.metrics import RequestResult, summarize
from blink.bench.result_folder import first_send
from blink.bench.workload import SampleRequest, arrival_offsets

READ_BUFSIZE = 1 << 24  # the client reads SSE lines up to 2x this (aiohttp's default: 512 KiB)


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    # Time-boxed runs (interference points): requests due after `max_duration_s` are not sent (give more
    # requests than the window needs, see requests_for_window), and those still running `drain_s` later
    # are cancelled and reported as `incomplete`, not as failures.
    max_duration_s: float | None = None
    drain_s: float = 30.0
    show_progress: bool = True
    extra_body: dict | None = None  # more request fields for every request (e.g. a structured-output constraint)
    # No garbage collection in the client while it measures (client_stalls.collector_held): a full collection of
    # its heap stamps every stream's next token late at once, which reads as a pause of the server
    hold_collector: bool = True


@dataclass
class LoadOutcome:
    results: list[RequestResult]  # finished requests, successful or failed, in completion order
    sent: int
    duration_s: float
    stalls: ClientStallRecorder | None = None  # the client's own loop lags and collections during the run
    started: list[RequestResult] | None = None  # every sent request, cancelled ones with what they received
    window_s: float | None = None  # a time box's fixed span: the send window plus the drain

    def client_stalls(self) -> dict | None:
        """The client's stalls on the clock of the raw requests' send times (ClientStallRecorder.relative_to)."""
        return self.stalls.relative_to(first_send(self.results)) if self.stalls else None

    @property
    def incomplete(self) -> int:
        """Sent but cancelled at the drain deadline."""
        return self.sent - len(self.results)

    def summary(self) -> dict:
        """summarize()'s fields; a time-boxed run adds the tokens every request received before the deadline
        (cancelled ones included) over the fixed window. Output throughput counts finished requests only, over
        the time to the last one, so at light load a server whose last long requests miss the deadline looked
        half as fast (host mode under attack at 2 req/s, 2026-12-03) although it kept up with the arrivals."""
        summary = {**summarize(self.results, self.duration_s), "sent": self.sent, "incomplete": self.incomplete}
        if self.window_s and self.started is not None:
            streamed = sum(r.tokens_received for r in self.started)
            summary.update(window_s=self.window_s, streamed_output_tokens=streamed,
                           window_output_throughput=streamed / self.window_s)
        return summary


def requests_for_window(request_rate: float, seconds: float) -> int:
    """Enough requests that a Poisson schedule at `request_rate` still has some due after `seconds`."""
    return math.ceil(1.5 * request_rate * seconds) + 16


async def run_load(config: LoadConfig, requests: list[SampleRequest]) -> LoadOutcome:
    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)
    limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    url = config.base_url.rstrip("/") + config.endpoint
    results: list[RequestResult] = []
    started: list[RequestResult] = []
    total = None if config.max_duration_s else len(requests)  # a time box sends only part of them
    progress = tqdm(total=total, disable=not config.show_progress, desc="requests")

    async def one(http: aiohttp.ClientSession, request: SampleRequest) -> None:
        payload = completion_payload(config.model, request, config.ignore_eos, config.temperature)
        payload.update(config.extra_body or {})
        async with limit or contextlib.nullcontext():
            result = RequestResult(prompt_len=request.prompt_len)
            started.append(result)
            await stream_completion(http, url, payload, request.prompt_len, result)
        results.append(result)
        progress.update(1)

    tasks: list[asyncio.Task] = []
    stalls = ClientStallRecorder(collector_held=config.hold_collector)
    with collector_held() if config.hold_collector else contextlib.nullcontext():
        stalls.start()
        try:
            duration = await _send_all(config, requests, offsets, one, tasks)
        finally:
            await stalls.stop()
    progress.close()
    window = config.max_duration_s + config.drain_s if config.max_duration_s else None
    return LoadOutcome(results=results, sent=len(tasks), duration_s=duration, stalls=stalls, started=started,
                       window_s=window)


async def _send_all(config: LoadConfig, requests: list[SampleRequest], offsets, one, tasks: list) -> float:
    """Send each request at its offset, wait for them up to the drain deadline; returns the run's seconds."""
    # No connection limit: the arrival schedule (and --max-concurrency), not the pool, bounds the load.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=60.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFSIZE) as http:
        start = time.perf_counter()
        send_deadline = start + config.max_duration_s if config.max_duration_s else math.inf
        for request, offset in zip(requests, offsets, strict=True):
            send_at = start + float(offset)
            if send_at > send_deadline:
                break
            await asyncio.sleep(max(0.0, send_at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(http, request)))
        drain_until = send_deadline + config.drain_s
        wait_s = None if math.isinf(drain_until) else max(0.0, drain_until - time.perf_counter())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=wait_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return time.perf_counter() - start


async def fetch_model_name(base_url: str) -> str:
    """The first model the server lists, for when --model is not given."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        response = await http.get(base_url.rstrip("/") + "/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
