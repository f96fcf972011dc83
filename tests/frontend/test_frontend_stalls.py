"""The front end's stall series: its event loop's lag (a blocked loop) and the egress gaps while requests are in
flight (a silent engine), to tell the two kinds of whole-server pause apart."""
from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from fastapi.testclient import TestClient

from blink.frontend.app import AppConfig, build_app
from blink.frontend.engine_client import EgressGaps, EngineClient
from blink.frontend.metrics import FrontendMetrics
from blink.request import FinishReason, SamplingParams, TokenEvent
from blink.transport.egress import EgressProducer
from blink.util.loop_lag import LoopLagMonitor
from tests.frontend.server_process import make_tokenizer_only_model


def test_the_loop_lag_is_the_time_a_blocking_callback_held_the_loop():
    lags: list[float] = []

    async def main():
        monitor = LoopLagMonitor(lags.append, tick_s=0.005)
        monitor.start()
        await asyncio.sleep(0.1)
        quiet = len(lags)
        time.sleep(0.1)  # a coroutine that blocks the loop for 100 ms
        await asyncio.sleep(0.05)
        await monitor.stop()
        stopped = len(lags)
        await asyncio.sleep(0.03)
        return quiet, stopped

    quiet, stopped = asyncio.run(main())
    assert quiet >= 5  # it ticked while the loop was free
    assert statistics.median(lags[:quiet]) < 0.02  # and those wake-ups came about on time
    assert max(lags) >= 0.08  # the block, less at most one tick
    assert all(lag >= 0 for lag in lags)
    assert len(lags) == stopped  # stop() ends it


def test_egress_gaps_are_timed_only_while_requests_are_in_flight():
    gaps: list[float] = []
    g = EgressGaps(gaps.append)
    g.read(10.0, True)  # the first read after idle starts the first gap
    g.read(10.01, True)
    g.read(10.2, True)  # a 190 ms silence of the engine
    assert gaps == pytest.approx([0.01, 0.19])
    g.idle()  # every request finished: idle time is not counted
    g.read(15.0, True)
    assert len(gaps) == 2
    g.read(15.005, True)
    g.read(16.0, False)  # records of aborted requests, nothing in flight: no gap, and no reference
    g.read(17.0, True)
    assert gaps[2:] == pytest.approx([0.005])


def test_the_engine_client_reports_the_gaps_it_reads(segment):
    segment.control.ready = 1
    gaps: list[float] = []
    egress = EgressProducer(segment)

    async def main():
        client = EngineClient(segment.name, on_egress_gap=gaps.append)
        client.start()
        try:
            req_id, queue = client.add_request([1, 2, 3], SamplingParams(max_tokens=3))
            egress.push([TokenEvent(req_id, 5, 0)])
            await queue.get()
            await asyncio.sleep(0.06)  # the engine silent for 60 ms
            egress.push([TokenEvent(req_id, 6, 1)])
            await queue.get()
            egress.push([TokenEvent(req_id, 7, 2, FinishReason.LENGTH)])
            await queue.get()
            await asyncio.sleep(0.1)  # idle
            egress.push([TokenEvent(req_id, 8, 3)])  # a stray record: nothing in flight
            await asyncio.sleep(0.1)
            second, queue = client.add_request([1, 2, 3], SamplingParams(max_tokens=1))
            egress.push([TokenEvent(second, 5, 0, FinishReason.LENGTH)])
            await queue.get()
        finally:
            client.close()

    asyncio.run(main())
    assert len(gaps) == 2  # token 0 -> 1 and 1 -> 2; neither idle stretch
    assert gaps[0] >= 0.05


def test_without_a_callback_the_client_times_nothing(segment):
    async def main():
        client = EngineClient(segment.name)
        client.start()
        client.close()
        return client.egress_gaps

    assert asyncio.run(main()) is None


def test_the_monitor_ticks_slower_while_idle():
    lags: list[float] = []
    busy = [True]

    async def main():
        monitor = LoopLagMonitor(lags.append, tick_s=0.01, idle_tick_s=0.2, busy=lambda: busy[0])
        monitor.start()
        await asyncio.sleep(0.3)
        serving = len(lags)
        busy[0] = False
        await asyncio.sleep(0.05)  # the tick already asked for ends; from then on idle ticks
        before_idle = len(lags)
        await asyncio.sleep(0.5)
        await monitor.stop()
        return serving, len(lags) - before_idle

    serving, idle = asyncio.run(main())
    assert serving >= 10 and 1 <= idle <= 4  # 100 Hz while busy, 5 Hz idle


def test_the_new_histograms_are_in_the_exposition_with_their_buckets():
    metrics = FrontendMetrics(None, "m")
    metrics.loop_lag.observe(0.07)
    metrics.egress_gap.observe(0.3)
    text = metrics.render(None).decode()
    assert 'blink:frontend_loop_lag_seconds_bucket{le="0.05",model_name="m"} 0.0' in text
    assert 'blink:frontend_loop_lag_seconds_bucket{le="0.1",model_name="m"} 1.0' in text
    assert 'blink:frontend_egress_gap_seconds_bucket{le="0.25",model_name="m"} 0.0' in text
    assert 'blink:frontend_egress_gap_seconds_bucket{le="0.5",model_name="m"} 1.0' in text
    bounds = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("blink:frontend_loop_lag_seconds_bucket")]
    assert bounds == ["0.001", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf"]


def test_the_app_runs_the_loop_lag_monitor_while_serving(segment, tmp_path):
    model = make_tokenizer_only_model(tmp_path / "model")
    config = AppConfig(shm_name=segment.name, model=str(model), served_model_name="m")

    def count(text: str) -> float:
        line = next(line for line in text.splitlines()
                    if line.startswith('blink:frontend_loop_lag_seconds_count{model_name="m"}'))
        return float(line.split()[-1])

    with TestClient(build_app(config)) as client:
        first = count(client.get("/metrics").text)
        time.sleep(0.6)  # idle: a tick every 250 ms
        text = client.get("/metrics").text
    assert count(text) > first  # the timer ticks on the app's loop
    assert 'blink:frontend_egress_gap_seconds_count{model_name="m"} 0.0' in text  # nothing in flight
