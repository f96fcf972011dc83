import numpy as np
import pytest

from blink.bench.metrics import RequestResult, per_request_details, percentile_stats, summarize


def test_percentile_stats_interpolate_linearly_in_ms():
    stats = percentile_stats("ttft", [1.0, 2.0, 3.0, 4.0])
    assert stats["mean_ttft_ms"] == pytest.approx(2500.0)
    assert stats["median_ttft_ms"] == pytest.approx(2500.0)
    assert stats["p90_ttft_ms"] == pytest.approx(3700.0)  # 1 + 0.9 * 3 seconds
    assert stats["p99_ttft_ms"] == pytest.approx(3970.0)
    assert stats["std_ttft_ms"] == pytest.approx(np.std([1000, 2000, 3000, 4000]))


def test_percentile_stats_of_nothing_are_zero():
    assert set(percentile_stats("itl", []).values()) == {0.0}


def test_tpot_excludes_the_first_token():
    r = RequestResult(success=True, output_tokens=11, ttft=0.5, latency=1.5)
    assert r.tpot == pytest.approx(0.1)
    assert RequestResult(success=True, output_tokens=1, ttft=0.5, latency=0.5).tpot is None
    assert RequestResult(success=False, output_tokens=11, ttft=0.5, latency=1.5).tpot is None


def test_summarize_follows_vllm_definitions():
    results = [
        RequestResult(success=True, prompt_len=10, output_tokens=3, ttft=0.1, itl=[0.2, 0.4], latency=0.7),
        RequestResult(success=True, prompt_len=20, output_tokens=1, ttft=0.3, itl=[], latency=0.3),
        RequestResult(success=False, prompt_len=99, error="HTTP 500"),
    ]
    s = summarize(results, duration_s=2.0)
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["failure_reasons"] == [("HTTP 500", 1)]
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (30, 4)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.0)
    assert s["total_token_throughput"] == pytest.approx(17.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    # TPOT only over requests with more than one token: (0.7 - 0.1) / 2.
    assert s["mean_tpot_ms"] == pytest.approx(300.0)
    assert s["p99_tpot_ms"] == pytest.approx(300.0)
    # ITLs are pooled over requests, not averaged per request.
    assert s["mean_itl_ms"] == pytest.approx(300.0)
    assert s["median_itl_ms"] == pytest.approx(300.0)
    assert s["p99_itl_ms"] == pytest.approx(398.0)
    assert s["mean_e2el_ms"] == pytest.approx(500.0)
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p90", "p99"):
            assert f"{stat}_{name}_ms" in s


def test_per_request_details_keep_request_order():
    results = [RequestResult(success=True, prompt_len=5, output_tokens=2, itl=[0.1]),
               RequestResult(error="boom")]
    details = per_request_details(results)
    assert details["input_lens"] == [5, 0]
    assert details["itls"] == [[0.1], []]
    assert details["errors"] == ["", "boom"]


def test_a_bench_command_without_its_packages_says_so_in_one_line(monkeypatch, capsys):
    """The benchmark packages are an extra: without them `blink` still parses, and the command explains."""
    import argparse
    import importlib

    from blink.bench import cli

    real = importlib.import_module

    def without_rich(name, *a, **kw):
        if name == "blink.bench.attackers":
            raise ModuleNotFoundError("No module named 'rich'", name="rich")
        return real(name, *a, **kw)

    monkeypatch.setattr(cli.importlib, "import_module", without_rich)
    parser = argparse.ArgumentParser()
    cli.add_bench_subcommands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["attack", "--cpus", "0"])
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'rich'" in err and "blink[bench]" in err


def test_failure_reasons_are_the_commonest_errors_counted():
    results = [RequestResult(error="HTTP 503: busy")] * 9 + [RequestResult(error="timeout")] * 2 + \
        [RequestResult(error=e) for e in ("a", "b")] + [RequestResult(success=True, output_tokens=1)]
    reasons = summarize(results, duration_s=1.0)["failure_reasons"]
    assert reasons[:2] == [("HTTP 503: busy", 9), ("timeout", 2)] and len(reasons) == 3
