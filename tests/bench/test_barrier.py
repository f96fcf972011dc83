"""`blink bench barrier` on the CPU: TP=2 over gloo on a tiny preset, isolated / one rank attacked / all."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blink.bench.cli import main

pytestmark = pytest.mark.slow  # spawns processes

REPO = Path(__file__).resolve().parents[2]
ENGINE_FLAGS = ["--model", "tiny-llama", "--device", "cpu", "-tp", "2", "--num-kv-blocks", "16",
                "--block-size", "4", "--max-num-seqs", "4"]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_barrier_three_conditions(tmp_path):
    first, second = sorted(os.sched_getaffinity(0))[:2]
    out = tmp_path / "barrier.json"
    cmd = [sys.executable, "-m", "blink", "bench", "barrier", *ENGINE_FLAGS, "--rank-cpus", f"{first};{second}",
           "--attack-rank", "1", "--num-prompts", "2", "--input-len", "4", "--output-len", "6",
           "--settle-s", "0", "--result-json", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["tensor_parallel_size"] == 2 and report["engine"] == "host" and report["all_reduce"] == "auto"
    assert report["rank_cpus"] == [[first], [second]]
    conditions = report["conditions"]
    assert list(conditions) == ["isolated", "rank1", "all"]
    for name, r in conditions.items():
        assert r["output_tokens"] == 2 * 6
        assert r["decode_steps"] >= 5 and r["steps"] >= r["decode_steps"]
        assert all(r["step"][k] > 0 for k in ("p50_ms", "p99_ms", "mean_ms"))
        assert r["step"]["p50_ms"] <= r["step"]["p99_ms"]
        if name != "isolated":
            assert set(r["ratio_to_isolated"]) == {"p50_ms", "p99_ms", "mean_ms", "output_tok_s"}
    assert conditions["isolated"]["attack"] is None
    assert conditions["rank1"]["attack"]["cpus"] == [second]
    assert len(conditions["rank1"]["attack"]["pids"]) == 1
    assert len(conditions["all"]["attack"]["pids"]) == len(os.sched_getaffinity(0))
    pids = conditions["rank1"]["attack"]["pids"] + conditions["all"]["attack"]["pids"]
    assert all(_gone(pid) for pid in pids)


def test_device_mode_on_the_cpu_is_refused_in_one_line(capsys):
    assert main(["barrier", *ENGINE_FLAGS, "--engine", "device", "--conditions", "isolated"]) == 2
    err = capsys.readouterr().err
    assert "--engine device needs a CUDA GPU" in err and err.count("\n") == 1


def test_rank_condition_needs_rank_cpus(capsys):
    assert main(["barrier", *ENGINE_FLAGS, "--conditions", "isolated,rank"]) == 2
    assert "needs --rank-cpus" in capsys.readouterr().err
