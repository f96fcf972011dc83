"""The interference lab end to end, with the fake server as an external mode (no `blink serve`)."""
import argparse
import json
import os

from blink.bench import interference
from blink.bench.interference_report import load_points
from tests.bench.fake_openai_server import MODEL


def lab_args(result_dir, base_url, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    interference.add_arguments(parser)
    return parser.parse_args([
        "--result-dir", str(result_dir), "--modes", "", "--extra-base-url", f"fake={base_url}",
        "--layouts", "shared", "--attack-kinds", "spin", "--attack-levels", "0,1",
        "--point-seconds", "0.6", "--drain-seconds", "5", "--attack-settle-seconds", "0.1",
        "--warmup-requests", "2", "--random-input-len", "12", "--random-output-len", "4",
        "--ignore-eos", "--disable-tqdm", *extra])


def test_sweep_writes_points_table_and_plots(fake_server, tmp_path):
    args = lab_args(tmp_path, fake_server.base_url, "--request-rates", "5,10")
    assert interference.run(args) == 0
    points = load_points(str(tmp_path))
    assert len(points) == 4
    ncpus = len(os.sched_getaffinity(0))
    for p in points:
        assert p["mode"] == "fake" and p["layout"] == "shared" and p["model"] == MODEL
        assert p["bench"]["completed"] > 0 and p["bench"]["failed"] == 0
        assert p["engine_pid"] == os.getpid()  # read from the fake's blink:engine_pid gauge
        assert p["engine_cpu_s_per_1k_tokens"] > 0
        if p["attack_kind"] == "none":
            assert p["attack_procs"] == 0 and p["attackers"] == []
        else:
            assert p["attack_procs"] == ncpus and p["attackers_alive_at_end"] == ncpus
            assert [a["returncode"] for a in p["attackers"]] == [0] * ncpus
        assert p["energy_per_output_token_mj"] is None or p["energy_per_output_token_mj"] > 0
    table = (tmp_path / "results.md").read_text()
    assert table.count("| shared | fake |") == 4
    assert table.count("| 1.000 |") >= 2  # the isolated points' retention
    for name in ("latency_shared.png", "retention_shared.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_rerunning_a_point_replaces_it(fake_server, tmp_path):
    assert interference.run(lab_args(tmp_path, fake_server.base_url, "--request-rates", "5",
                                     "--attack-levels", "0")) == 0
    path = tmp_path / "points" / "fake__shared__none-x0__rate-5.json"
    first = json.loads(path.read_text())
    assert interference.run(lab_args(tmp_path, fake_server.base_url, "--request-rates", "5",
                                     "--attack-levels", "0", "--seed", "1")) == 0
    assert len(load_points(str(tmp_path))) == 1
    assert json.loads(path.read_text())["bench"] != first["bench"]
