"""A time-boxed load (interference points): what a request cut at the drain deadline received still counts
in the windowed throughput, and the report never divides one throughput definition by the other."""
from __future__ import annotations

import asyncio

from blink.bench.interference_report import values
from blink.bench.runner import LoadConfig, run_load
from blink.bench.workload import SampleRequest
from tests.bench.fake_openai_server import FakeServer


def test_a_cut_request_keeps_the_tokens_it_received():
    # 20 ms a token: the 5-token request finishes, the 400-token one (8 s) is cut at the 0.6 s deadline
    requests = [SampleRequest("a b", 2, 5), SampleRequest("c d", 2, 400)]
    with FakeServer(token_delay_s=0.02) as server:
        config = LoadConfig(base_url=server.base_url, model="fake", ignore_eos=True, request_rate=1000.0,
                            max_duration_s=0.1, drain_s=0.5, show_progress=False)
        outcome = asyncio.run(run_load(config, requests))
    summary = outcome.summary()
    assert summary["completed"] == 1 and summary["incomplete"] == 1
    assert summary["total_output_tokens"] == 5
    cut = max(outcome.started, key=lambda r: r.streamed_tokens)
    assert not cut.success and 5 < cut.streamed_tokens < 400
    assert summary["streamed_output_tokens"] == 5 + cut.streamed_tokens
    assert summary["window_s"] == 0.6
    assert summary["window_output_throughput"] == summary["streamed_output_tokens"] / 0.6


def test_untimed_runs_have_no_window():
    with FakeServer() as server:
        config = LoadConfig(base_url=server.base_url, model="fake", ignore_eos=True, show_progress=False)
        summary = asyncio.run(run_load(config, [SampleRequest("a", 1, 3)])).summary()
    assert summary["completed"] == 1 and "window_output_throughput" not in summary


def _point(throughput, windowed=None, energy=None, energy_streamed=None):
    bench = {"output_throughput": throughput}
    if windowed is not None:
        bench["window_output_throughput"] = windowed
    return {"bench": bench, "energy_per_output_token_mj": energy, "energy_per_streamed_token_mj": energy_streamed}


def test_the_report_uses_the_windowed_definition_only_where_every_repeat_has_it():
    new = [_point(100.0, 180.0, 5.0, 3.0), _point(110.0, 190.0, 6.0, 4.0)]
    old = [_point(200.0, energy=7.0)]
    assert values(new, "output_throughput") == [180.0, 190.0]
    assert values(new, "energy_per_output_token_mj") == [3.0, 4.0]
    assert values(new, "output_throughput", old) == [100.0, 110.0]  # its twin is old: the old definition
    assert values(old, "output_throughput", new) == [200.0]
    assert values(new + old, "energy_per_output_token_mj") == [5.0, 6.0, 7.0]
