"""The stalls per point (blink/bench/server_stalls.py): the front end's loop lags and egress gaps and the engine's
busy step intervals read from /metrics as bucket differences, and the whole-server pauses table's columns for them
and for the full collections."""
from __future__ import annotations

import pytest

from blink.bench import server_stalls
from blink.bench.result_folder import raw_requests
from blink.bench.server_report import full_gcs_cell, pauses_section, steps_section
from blink.frontend.metrics import FrontendMetrics
from blink.transport.layout import ControlBlock, step_interval_bucket
from tests.bench.test_pauses import streams


def serve(monkeypatch, texts: list[str]) -> None:
    """httpx.get answers /metrics with each text in turn."""
    answers = iter(texts)

    class Response:
        status_code = 200

        def __init__(self):
            self.text = next(answers)

    monkeypatch.setattr(server_stalls.httpx, "get", lambda url, timeout: Response())


def exposition(metrics: FrontendMetrics, control=None) -> str:
    return metrics.render(control).decode()


def test_stalls_over_a_point_are_the_bucket_differences(monkeypatch):
    metrics = FrontendMetrics(None, "m")
    metrics.loop_lag.observe(0.2)  # before the point: not its own
    metrics.egress_gap.observe(0.004)
    before = exposition(metrics)
    for lag in (0.003, 0.07, 0.12, 0.2):
        metrics.loop_lag.observe(lag)
    metrics.egress_gap.observe(7.0)  # past the last bucket
    metrics.egress_gap.observe(0.02)
    metrics.gc_collected(2, 0.005)
    serve(monkeypatch, [before, exposition(metrics)])
    first, second = server_stalls.read_server("http://x"), server_stalls.read_server("http://x")
    stalls = server_stalls.stall_delta(first.stalls, second.stalls)
    lag, gap = stalls["loop_lag"], stalls["egress_gap"]
    assert (lag["count"], lag["over_50ms"], lag["over_100ms"], lag["longest_le"]) == (4, 3, 2, "0.25")
    assert lag["buckets"]["0.005"] == 1 and lag["buckets"]["+Inf"] == 4
    assert (gap["count"], gap["over_50ms"], gap["over_100ms"], gap["longest_le"]) == (2, 1, 1, "+Inf")
    assert server_stalls.gc_delta(first.gc, second.gc) == {"gen2_count": 1.0, "gen2_seconds": 0.005}


def test_a_quiet_point_and_a_server_without_the_series(monkeypatch):
    metrics = FrontendMetrics(None, "m")
    text = exposition(metrics)  # the histograms are there from the start, empty
    peer = '# TYPE blink:engine_pid gauge\nblink:engine_pid{model_name="fake"} 1.0\n'
    serve(monkeypatch, [text, text, peer])
    first, second, other = (server_stalls.read_server("http://x") for _ in range(3))
    quiet = server_stalls.stall_delta(first.stalls, second.stalls)
    lag = quiet["loop_lag"]
    assert (lag["count"], lag["over_50ms"], lag["over_100ms"], lag["longest_le"]) == (0, 0, 0, None)
    assert first.gc == {}  # the collections' series without a collection yet: none, not unknown
    assert other.stalls is None and other.gc is None
    assert server_stalls.stall_delta(first.stalls, other.stalls) is None
    assert server_stalls.stall_delta(None, second.stalls) is None


def test_the_engine_step_intervals_come_from_the_control_block(monkeypatch):
    """blink:engine_step_interval_seconds is the control block's line 7 (the GPU scheduler's or host mode's
    counts per bucket), cumulated; a point reads it as the third stall series."""
    metrics = FrontendMetrics(None, "m")
    ctl = ControlBlock()
    before = exposition(metrics, ctl)
    for ns, times in ((4_000_000, 50), (30_000_000, 2), (180_000_000, 1)):
        ctl.step_intervals[step_interval_bucket(ns)] += times
        ctl.step_intervals_sum_ns += ns * times
    after = exposition(metrics, ctl)
    assert 'blink:engine_step_interval_seconds_bucket{le="0.005",model_name="m"} 50.0' in after
    assert 'blink:engine_step_interval_seconds_bucket{le="+Inf",model_name="m"} 53.0' in after
    serve(monkeypatch, [before, after])
    first, second = server_stalls.read_server("http://x"), server_stalls.read_server("http://x")
    engine = server_stalls.stall_delta(first.stalls, second.stalls)["engine_interval"]
    assert (engine["count"], engine["over_50ms"], engine["over_100ms"], engine["longest_le"]) == (53, 1, 1, "0.25")


@pytest.mark.parametrize(("gc", "cell"), [
    (None, "-"),
    ({}, "0"),
    ({"gen0_count": 40.0, "gen0_seconds": 0.004}, "0"),  # no full collection in the process's life yet
    ({"gen0_count": 40.0, "gen0_seconds": 0.004, "gen2_count": 0.0, "gen2_seconds": 0.0}, "0"),  # not here
    ({"gen2_count": 2.0, "gen2_seconds": 0.0104}, "2 / 10 ms"),
])
def test_the_full_collections_cell_reads_the_same_for_none(gc, cell):
    assert full_gcs_cell(gc) == cell


def test_the_pauses_table_shows_stalls_where_measured_and_a_dash_elsewhere():
    raw = raw_requests(streams(lambda i: 70 - 5 * i))
    lag = {"count": 900, "over_50ms": 2, "over_100ms": 1, "longest_le": "0.25", "buckets": {}}
    gap = {"count": 800, "over_50ms": 1, "over_100ms": 1, "longest_le": "+Inf",
           "buckets": {"0.001": 10, "2.5": 799, "5.0": 799, "+Inf": 800}}
    quiet = {"count": 0, "over_50ms": 0, "over_100ms": 0, "longest_le": None, "buckets": {}}
    new = {"run_id": "a", "repeat": 0, "requests": raw, "frontend_gc": {"gen2_count": 0.0, "gen2_seconds": 0.0},
           "frontend_stalls": {"loop_lag": lag, "egress_gap": gap}}
    idle = {"run_id": "b", "repeat": 0, "requests": raw, "frontend_gc": {},
            "frontend_stalls": {"loop_lag": lag, "egress_gap": quiet, "engine_interval": quiet}}
    old = {"run_id": "c", "repeat": 0, "requests": raw, "frontend_gc": None}  # before the key existed
    row = {"layout": "split", "mode": "device", "attack_kind": "none", "attack_level": 0.0, "variant": "",
           "request_rate": 24.0, "_repeats": [new, idle, old]}
    text = pauses_section([row])
    assert "| loop lags > 50 / > 100 ms | egress gaps > 50 / > 100 ms | engine step intervals > 50 / > 100 ms |" in text
    assert "| a-r0 | 0.72 s 150 ms 10/10 | 0 | 2 / 1, <= 250 ms | 1 / 1, > 5000 ms | - |" in text
    assert "| b-r0 | 0.72 s 150 ms 10/10 | 0 | 2 / 1, <= 250 ms | 0 / 0 | 0 / 0 |" in text
    assert "| c-r0 | 0.72 s 150 ms 10/10 | - | - | - | - |" in text
    header = next(line for line in text.splitlines() if line.startswith("| layout"))
    assert all(line.count("|") == header.count("|") for line in text.splitlines() if line.startswith("| split"))


def test_the_engine_steps_of_a_point_and_their_table(monkeypatch):
    """blink:engine_steps / _generated_tokens before and after a point give its steps and tokens per step; the
    report's steps section shows them with the GPU's energy per step, and skips points without them."""
    metrics = FrontendMetrics(None, "m")
    ctl = ControlBlock()
    ctl.steps, ctl.tokens, ctl.preemptions = 100, 900, 3
    before = exposition(metrics, ctl)
    ctl.steps, ctl.tokens, ctl.preemptions = 150, 1300, 7
    serve(monkeypatch, [before, exposition(metrics, ctl), "# nothing\n"])
    first, second, peer = (server_stalls.read_server("http://x") for _ in range(3))
    steps = server_stalls.engine_delta(first.engine, second.engine)
    assert steps == {"steps": 50, "generated_tokens": 400, "tokens_per_step": 8.0, "preemptions": 4}
    assert peer.engine is None and server_stalls.engine_delta(first.engine, peer.engine) is None
    other = {"steps": 40, "generated_tokens": 400, "tokens_per_step": 10.0}  # before session 11: no preemptions
    row = {"layout": "split", "mode": "device", "attack_kind": "none", "attack_level": 0.0, "variant": "",
           "request_rate": 24.0, "_repeats": [{"engine_steps": steps, "gpu_energy_mj": 25_000.0},
                                              {"engine_steps": other, "gpu_energy_mj": 24_000.0}]}
    old = {**row, "mode": "host", "_repeats": [{"gpu_energy_mj": 1.0}]}  # before session 10: no steps
    text = steps_section([row, old])
    assert ("| split | device | isolated | 24.00 | 2 | 45 [40-50] | 9.00 [8.00-10.00] | 550.0 [500.0-600.0] | 4 |"
            in text)
    assert "| host |" not in text
    assert "No repeat recorded" in steps_section([old])
