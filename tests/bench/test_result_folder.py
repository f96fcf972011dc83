"""The interference result folder: repeats kept apart, raw latencies round-tripped, folders merged."""
import json
import os

import pytest

from blink.bench.interference_report import summarize, write_report
from blink.bench.metrics import RequestResult
from blink.bench.result_folder import (
    load_points,
    merge_folder,
    pack_gaps,
    raw_requests,
    request_samples,
    save_repeat,
    save_run,
    unpack_gaps,
)


def fake_point(run_id, repeat, kind="none", level=0.0, rate=8.0, throughput=100.0, ttft_ms=50.0):
    results = [RequestResult(success=True, prompt_len=4, output_tokens=3, ttft=ttft_ms / 1000, latency=0.2,
                             itl=[0.075, 0.075]),
               RequestResult(success=False, error="boom")]
    return {"mode": "device", "layout": "split", "attack_kind": kind, "attack_level": level, "variant": "",
            "request_rate": rate, "run_id": run_id, "repeat": repeat, "energy_per_output_token_mj": 2.0,
            "bench": {"completed": 1, "failed": 1, "incomplete": 0, "median_ttft_ms": ttft_ms,
                      "p99_ttft_ms": ttft_ms, "median_tpot_ms": 75.0, "p99_tpot_ms": 75.0, "median_itl_ms": 75.0,
                      "p99_itl_ms": 75.0, "output_throughput": throughput},
            "requests": raw_requests(results)}


def test_gaps_round_trip_at_microsecond_resolution():
    gaps = [[0.0101234, 0.5], [], [1.25e-6, 3.0]]
    assert unpack_gaps(pack_gaps(gaps)) == [[0.010123, 0.5], [], [1e-6, 3.0]]


def test_raw_samples_are_the_successful_requests():
    p = fake_point("r", 0)
    assert request_samples(p, "ttft") == [0.05]
    assert request_samples(p, "itl") == [0.075, 0.075]
    assert request_samples(p, "tpot") == pytest.approx([(0.2 - 0.05) / 2])
    assert request_samples({"bench": {}}, "ttft") == []


def test_repeats_are_separate_files_and_summarised_together(tmp_path):
    for repeat, ttft in enumerate((40.0, 50.0, 90.0)):
        save_repeat(str(tmp_path), fake_point("run1", repeat, ttft_ms=ttft))
    save_repeat(str(tmp_path), fake_point("run1", 0, kind="spin", level=2.0, throughput=80.0))
    points = load_points(str(tmp_path))
    assert len(points) == 4
    rows = summarize(points)
    iso = next(r for r in rows if r["attack_kind"] == "none")
    assert iso["repeats"] == 3
    assert (iso["p99_ttft_ms"]["median"], iso["p99_ttft_ms"]["min"], iso["p99_ttft_ms"]["max"]) == (50, 40, 90)
    assert iso["pooled_p99_ttft_ms"]["n"] == 3  # one successful request per repeat
    spin = next(r for r in rows if r["attack_kind"] == "spin")
    assert spin["retention"]["median"] == pytest.approx(0.8)
    tables = write_report(str(tmp_path), plots=False)  # what the sweep writes after each point
    assert sorted(os.path.basename(p) for p in tables) == ["results.md", "summary.json"]
    assert not list(tmp_path.glob("*.png"))
    written = write_report(str(tmp_path))
    assert "50.0 [40.0-90.0]" in (tmp_path / "results.md").read_text()
    assert all(path.endswith((".md", ".json", ".png")) for path in written)
    assert {p for p in written if p.endswith(".png")} == {str(p) for p in tmp_path.glob("*.png")} != set()


def test_merge_copies_new_repeats_skips_equal_ones_and_refuses_conflicts(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_repeat(str(a), fake_point("run1", 0))
    save_repeat(str(b), fake_point("run1", 0))  # the same file (carried back from the device, say)
    save_repeat(str(b), fake_point("run2", 1))
    save_run(str(b), "run2", {"run_id": "run2"})
    assert merge_folder(str(a), str(b)) == {"copied": 2, "skipped": 1}
    assert [p["run_id"] for p in load_points(str(a))] == ["run1", "run2"]
    path = next((b / "points").glob("*/run2-r1.json"))
    changed = json.loads(path.read_text())
    changed["bench"]["p99_ttft_ms"] = 1.0
    path.write_text(json.dumps(changed))
    with pytest.raises(ValueError, match="differs"):
        merge_folder(str(a), str(b))


def test_a_flat_point_of_the_old_layout_is_read_as_one_repeat(tmp_path):
    (tmp_path / "points").mkdir()
    old = fake_point("x", 0)
    del old["run_id"], old["repeat"], old["variant"], old["requests"]
    (tmp_path / "points" / "device__split__none-x0__rate-8.json").write_text(json.dumps(old))
    [p] = load_points(str(tmp_path))
    assert (p["run_id"], p["repeat"], p["variant"]) == ("legacy", 0, "")
    [row] = summarize([p])
    assert row["pooled_p99_ttft_ms"]["value"] is None and row["p99_ttft_ms"]["median"] == 50.0


def test_mode_ratios_set_host_over_device_beside_the_paper(tmp_path):
    for repeat in range(2):
        device = fake_point("run1", repeat, ttft_ms=50.0, throughput=200.0)
        host = fake_point("run1", repeat, ttft_ms=200.0, throughput=100.0)
        host["mode"], host["energy_per_output_token_mj"] = "host", 4.0
        save_repeat(str(tmp_path), device)
        save_repeat(str(tmp_path), host)
    write_report(str(tmp_path))
    text = (tmp_path / "results.md").read_text()
    assert "| Blink paper | device | headline | - | 8.47 | 3.40 | 2.10 | -0.486 | - |" in text
    # P99 TTFT 200/50, TPOT equal, throughput 200/100, energy 2/4 - 1; no CPU energy recorded: "-"
    assert "| split | device | isolated | 8 | 4.00 [4.00, 4.00] | 1.00 [1.00, 1.00] | 2.00 [2.00, 2.00] | " \
           "-0.500 [-0.500, -0.500] | - |" in text
    assert "_repeats" not in (tmp_path / "summary.json").read_text()


def test_a_mode_variant_gets_its_own_ratios_against_host_mode(tmp_path):
    for repeat in range(2):
        device = fake_point("run1", repeat, ttft_ms=50.0, throughput=200.0)
        paced = fake_point("run1", repeat, ttft_ms=100.0, throughput=200.0)
        host = fake_point("run1", repeat, ttft_ms=200.0, throughput=100.0)
        paced["mode"], paced["energy_per_output_token_mj"] = "device-paced", 3.0
        host["mode"], host["energy_per_output_token_mj"] = "host", 4.0
        for point in (device, paced, host):
            save_repeat(str(tmp_path), point)
    write_report(str(tmp_path))
    text = (tmp_path / "results.md").read_text()
    section = text.split("## Device mode against host mode")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| split |")]
    assert [row.split(" | ")[1] for row in rows] == ["device", "device-paced"]
    assert rows[1].startswith("| split | device-paced | isolated | 8 | 2.00 [2.00, 2.00] | 1.00 [1.00, 1.00] | "
                               "2.00 [2.00, 2.00] | -0.250 [-0.250, -0.250] |")


def test_cpu_energy_joins_the_gpus_in_the_table_and_the_ratio(tmp_path):
    """Where the points recorded the CPU packages' energy (RAPL), the table shows it a token and the ratio of GPU +
    CPU energy sits beside the GPU's alone: here the host engine's busy CPU turns a GPU loss into a saving."""
    for repeat in range(2):
        device = fake_point("run1", repeat)
        host = fake_point("run1", repeat)
        host["mode"] = "host"
        device["energy_per_streamed_token_mj"], device["cpu_energy_per_streamed_token_mj"] = 2.2, 0.8
        host["energy_per_streamed_token_mj"], host["cpu_energy_per_streamed_token_mj"] = 2.0, 2.0
        save_repeat(str(tmp_path), device)
        save_repeat(str(tmp_path), host)
    write_report(str(tmp_path))
    text = (tmp_path / "results.md").read_text()
    assert "| mJ / out tok | CPU mJ / out tok | idle W |" in text
    assert "| 2.2 | 0.8 | - |" in text and "| 2.0 | 2.0 | - |" in text
    # GPU alone 2.2 / 2.0 - 1 = +0.1; GPU + CPU 3.0 / 4.0 - 1 = -0.25
    assert "| 0.100 [0.100, 0.100] | -0.250 [-0.250, -0.250] |" in text
    assert "_repeats" not in (tmp_path / "summary.json").read_text()


def test_runs_table_names_the_front_end_niceness_and_serve_flags():
    from blink.bench.interference_report import runs_section
    plain = {"run_id": "a", "plan": [{"repeat": 0}], "knobs": {"nice": None}, "args": {"serve_args": ""}}
    niced = {"run_id": "b", "plan": [{"repeat": 1}], "knobs": {"nice": 19},
             "args": {"frontend_nice": -10, "serve_args": "--max-num-seqs 8"}}
    table = runs_section([plain, niced]).splitlines()
    assert "| a | 0 | - |" in table[4]
    assert "nice=19, frontend_nice=-10, serve_args=--max-num-seqs 8" in table[5]


def test_the_table_counts_the_code_versions_behind_a_points_repeats(tmp_path):
    """Repeats merge across sessions while the code changes: each row says how many sources measured it."""
    for repeat, sha in enumerate(["aaa", "bbb", "aaa", None]):
        point = fake_point("run1", repeat)
        if sha:
            point["code"] = {"commit": None, "dirty": None, "source_sha": sha}
        save_repeat(str(tmp_path), point)
    write_report(str(tmp_path))
    text = (tmp_path / "results.md").read_text()
    assert "| idle W | code versions |" in text
    assert "| - | 2 (+1 unrecorded) |" in text


def test_a_point_records_the_source_it_ran():
    from blink.bench.code_version import code_version
    version = code_version()
    assert len(version["source_sha"]) == 12 and set(version) == {"commit", "dirty", "source_sha"}
