"""The interference lab starting the real `blink serve` itself (host engine, tiny model, CPU), exposed layout:
one server start per repeat, the front end pinned to the attacked core, every repeat kept."""
import argparse
import os

import pytest

from blink.bench import interference
from blink.bench.result_folder import load_points, load_runs
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns servers


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores: one attacked, one for the client")
def test_lab_restarts_blink_serve_per_repeat_in_the_exposed_layout(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", "llama")
    cpus = sorted(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser()
    interference.add_arguments(parser)
    args = parser.parse_args([
        "--result-dir", str(tmp_path / "out"), "--model", str(model_dir), "--modes", "host",
        "--layouts", "exposed", "--engine-cpus", str(cpus[-1]), "--client-cpus", str(cpus[0]),
        "--attack-kinds", "spin", "--attack-levels", "0,1", "--request-rates", "4", "--repeats", "2",
        "--point-seconds", "1", "--drain-seconds", "20", "--attack-settle-seconds", "0.2",
        "--warmup-requests", "2", "--random-input-len", "40", "--random-output-len", "4", "--ignore-eos",
        "--idle-power-seconds", "0.1", "--disable-tqdm", "--port", "8391", "--server-timeout", "300",
        "--serve-args", "--device cpu --max-num-seqs 8"])
    assert interference.run(args) == 0
    points = load_points(str(tmp_path / "out"))
    assert len(points) == 4 and sorted({p["repeat"] for p in points}) == [0, 1]
    for p in points:
        assert p["bench"]["completed"] > 0 and p["bench"]["failed"] == 0
        assert p["frontend_cpus"] == str(cpus[-1]) and p["client_cpus"] == str(cpus[0])
        assert f"--frontend-cpus {cpus[-1]}" in p["server_command"]
        assert p["engine_cpu_seconds"] is not None and p["engine_cpu_seconds"] > 0
        # Every point replays the same prompts: each starts from an empty prefix cache, so none is served
        # from the blocks of the warm-up or of the points before it.
        assert p["prefix_cache_reset"] is True and p["bench"]["prefix_cache_hit_rate"] == 0
    [run] = load_runs(str(tmp_path / "out"))
    assert len(run["server_idle_power"]) == 2  # a server start per repeat
    logs = os.listdir(tmp_path / "out" / "logs")
    assert len(logs) == 2 and all("exposed-host" in name for name in logs)
