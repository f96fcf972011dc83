"""The interference lab end to end, with the fake server as an external mode (no `blink serve`)."""
import argparse
import itertools
import json
import os

import pytest

from blink.bench import interference, sweep_runner
from blink.bench.result_folder import load_points, load_runs, request_samples
from tests.bench.fake_openai_server import MODEL


def lab_args(result_dir, base_url, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    interference.add_arguments(parser)
    return parser.parse_args([
        "--result-dir", str(result_dir), "--modes", "", "--extra-base-url", f"fake={base_url}",
        "--layouts", "shared", "--attack-kinds", "spin", "--attack-levels", "0,1",
        "--point-seconds", "0.6", "--drain-seconds", "5", "--attack-settle-seconds", "0.1",
        "--warmup-requests", "2", "--random-input-len", "12", "--random-output-len", "4",
        "--idle-power-seconds", "0.1", "--ignore-eos", "--disable-tqdm", *extra])


def test_repeated_sweep_keeps_every_repeat_and_summarises(fake_server, tmp_path):
    args = lab_args(tmp_path, fake_server.base_url, "--request-rates", "5,10", "--repeats", "2")
    assert interference.run(args) == 0
    points = load_points(str(tmp_path))
    assert len(points) == 8  # 2 conditions x 2 rates x 2 repeats
    assert sorted({p["repeat"] for p in points}) == [0, 1] and len({p["run_id"] for p in points}) == 1
    ncpus = len(os.sched_getaffinity(0))
    for p in points:
        assert p["mode"] == "fake" and p["layout"] == "shared" and p["model"] == MODEL
        assert "gpu" in p  # the card's NVML name (None on this CPU machine): repeats of one folder share it
        assert p["bench"]["completed"] > 0 and p["bench"]["failed"] == 0
        assert p["engine_pid"] == os.getpid()  # read from the fake's blink:engine_pid gauge
        assert p["frontend_gc"] is None and p["frontend_stalls"] is None and p["engine_steps"] is None  # no series
        # the client's own stalls, on the send-time clock: each lag starts inside the point's run
        assert set(p["client_stalls"]) == {"loop_lags", "gcs", "collector_held"}
        assert p["client_stalls"]["collector_held"]  # LoadConfig's default
        assert all(-1.0 < start < 30.0 and lag >= 0.02 for start, lag in p["client_stalls"]["loop_lags"])
        # the raw per-request latencies are kept, and give back the summary's percentiles' inputs
        assert len(request_samples(p, "ttft")) == p["bench"]["completed"]
        assert len(request_samples(p, "itl")) > 0
        if p["attack_kind"] == "none":
            assert p["attack_procs"] == 0 and p["attackers"] == []
        else:
            assert p["attack_procs"] == ncpus and p["attackers_alive_at_end"] == ncpus
            assert [a["returncode"] for a in p["attackers"]] == [0] * ncpus
            assert all(a["policy"] == "other" for a in p["attackers"])
        assert p["energy_per_output_token_mj"] is None or p["energy_per_output_token_mj"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary) == 4 and all(row["repeats"] == 2 for row in summary)
    for row in summary:
        ttft = row["p99_ttft_ms"]
        assert ttft["n"] == 2 and ttft["min"] <= ttft["median"] <= ttft["max"]
        assert row["pooled_p99_ttft_ms"]["n"] == sum(
            p["bench"]["completed"] for p in points
            if (p["attack_kind"], p["request_rate"]) == (row["attack_kind"], row["request_rate"]))
        if row["attack_kind"] == "none":
            assert row["retention"]["median"] == 1.0
    table = (tmp_path / "results.md").read_text()
    summary, pauses = table.split("## Whole-server pauses")
    assert summary.count("| shared | fake |") == 4
    assert pauses.count("| shared | fake |") == 8  # every repeat of every point, timed by its send times
    [run] = load_runs(str(tmp_path))
    assert [r["repeat"] for r in run["plan"]] == [0, 1] and run["left_points"] == 0
    assert len(run["server_idle_power"]) == 2  # one reading per server group per repeat
    for name in ("latency_shared.png", "retention_shared.png", "energy_shared.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_second_run_adds_repeats_and_merge_joins_folders(fake_server, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    common = ("--request-rates", "5", "--attack-levels", "0")
    assert interference.run(lab_args(first, fake_server.base_url, *common)) == 0
    assert interference.run(lab_args(first, fake_server.base_url, *common, "--first-repeat", "1")) == 0
    assert [p["repeat"] for p in load_points(str(first))] == [0, 1]
    assert interference.run(lab_args(second, fake_server.base_url, *common, "--first-repeat", "2")) == 0
    merge = lab_args(first, fake_server.base_url, "--merge-from", str(second))
    assert interference.run(merge) == 0
    assert [p["repeat"] for p in load_points(str(first))] == [0, 1, 2]
    assert len(load_runs(str(first))) == 3
    assert interference.run(merge) == 0  # merging again copies nothing twice
    assert len(load_points(str(first))) == 3
    [row] = json.loads((first / "summary.json").read_text())
    assert row["repeats"] == 3 and len(row["runs"]) == 3


def test_time_budget_stops_and_resume_finishes_the_plan(fake_server, tmp_path, monkeypatch):
    common = ("--request-rates", "5,10", "--attack-levels", "0", "--repeats", "2", "--point-cost-s", "1",
              "--server-start-s", "0")
    # The budget's clock moves 1 s a reading: start 0, group 1 (1 + 1 <= 3.5), point 1 (2 + 1 <= 3.5),
    # point 2 (3 + 1 > 3.5): one point measured, three left.
    ticks = itertools.count()
    monkeypatch.setattr(sweep_runner, "clock", lambda: float(next(ticks)))
    assert interference.run(lab_args(tmp_path, fake_server.base_url, *common, "--time-budget-s", "3.5")) == 0
    assert len(load_points(str(tmp_path))) == 1
    assert load_runs(str(tmp_path))[0]["left_points"] == 3
    monkeypatch.setattr(sweep_runner, "clock", lambda: 0.0)
    assert interference.run(lab_args(tmp_path, fake_server.base_url, *common, "--resume")) == 0
    points = load_points(str(tmp_path))
    assert sorted((p["request_rate"], p["repeat"]) for p in points) == [(5, 0), (5, 1), (10, 0), (10, 1)]


def test_attacker_knobs_are_applied_recorded_and_keep_points_apart(fake_server, tmp_path):
    common = ("--request-rates", "5", "--attack-levels", "1")
    assert interference.run(lab_args(tmp_path, fake_server.base_url, *common)) == 0
    assert interference.run(lab_args(tmp_path, fake_server.base_url, *common, "--attacker-nice", "5",
                                     "--attacker-sched", "batch")) == 0
    plain, niced = load_points(str(tmp_path))
    assert (plain["variant"], niced["variant"]) == ("", "nice5-batch")
    assert niced["attacker_knobs"]["nice"] == 5 and niced["attacker_knobs"]["policy"] == "batch"
    assert {a["policy"] for a in niced["attackers"]} == {"batch"}
    assert {a["nice"] for a in niced["attackers"]} == {os.getpriority(os.PRIO_PROCESS, 0) + 5}
    assert "spin x1 [nice5-batch]" in (tmp_path / "results.md").read_text()


def test_start_estimates_follow_the_starts_seen():
    assert sweep_runner.start_estimate(240.0, {}, "host") == 240.0  # nothing seen: the flag
    starts = {"host": [180.0, 20.0]}  # the first start compiled, the second reused the caches
    assert sweep_runner.start_estimate(240.0, starts, "host") == 20.0
    assert sweep_runner.start_estimate(240.0, starts, "device") == 30.0  # another mode: 1.5x what was seen
    starts["device"] = [50.0]
    assert sweep_runner.start_estimate(240.0, starts, "device") == 50.0


def test_the_budget_counts_the_server_starts_seen(fake_server, tmp_path, monkeypatch):
    """A fresh machine's first starts take minutes (compiles): once one is seen, a group that no longer
    fits its start is not begun, whatever --server-start-s estimated."""
    now, starts = [0.0], []
    monkeypatch.setattr(sweep_runner, "clock", lambda: now[0])

    class SlowStart:  # stands in for `blink serve`: the fake server answers at its port; starting takes 100 s
        engine_pid = None

        def __init__(self, *args):
            pass

        def __enter__(self):
            now[0] += 100.0
            starts.append(now[0])
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(sweep_runner, "BlinkServer", SlowStart)
    port = fake_server.base_url.rsplit(":", 1)[1]
    args = lab_args(tmp_path, fake_server.base_url, "--modes", "host", "--port", port, "--request-rates", "5",
                    "--attack-levels", "0", "--repeats", "2", "--point-cost-s", "1", "--server-start-s", "0",
                    "--time-budget-s", "150")
    args.extra_base_url = []  # only the "host" mode, whose server is SlowStart over the fake
    assert interference.run(args) == 0
    # repeat 0 started at 0 and took 100 s to start; repeat 1 would need 100 + 100 + 1 > 150: not started
    assert starts == [100.0]
    assert [p["repeat"] for p in load_points(str(tmp_path))] == [0]


def test_sigterm_mid_sweep_keeps_the_points_measured_and_stops_the_attackers(fake_server, tmp_path):
    """SIGTERM during a point's load ends the run at once with 143; the points before it are saved, and the point it
    cut is not; its attackers are stopped (a `with` teardown, never inside Popen's bookkeeping)."""
    import signal
    import threading
    import time

    args = lab_args(tmp_path, fake_server.base_url, "--request-rates", "5", "--repeats", "3",
                    "--point-seconds", "2.5")
    before = set(live_children())  # other fixtures' processes, if any
    timer = threading.Timer(5.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t = time.monotonic()
    try:
        assert interference.run(args) == 128 + signal.SIGTERM
    finally:
        timer.cancel()
    assert time.monotonic() - t < 15.0  # the whole plan (6 points of 2.5 s + drains) would take far longer
    points = load_points(str(tmp_path))
    assert 0 < len(points) < 6 and all(p["bench"]["completed"] > 0 for p in points)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the lab's handler is gone
    assert set(live_children()) <= before, "the cut point's attackers were stopped"


def live_children() -> list[int]:
    """This process's children that are still running (not zombies)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append(int(name))
    return out


def test_a_required_gpu_that_is_not_this_one_measures_nothing(fake_server, tmp_path):
    """The matrix's points are one card's (H200): a session lent another card must not add its points."""
    args = lab_args(tmp_path, fake_server.base_url, "--request-rates", "5", "--require-gpu", "H200")
    with pytest.raises(SystemExit, match="--require-gpu H200: this card is .*nothing measured"):
        interference.run(args)
    assert load_points(str(tmp_path)) == []
