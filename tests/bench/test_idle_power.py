"""blink/bench/idle_power.py end to end on the CPU (host mode, demo model; NVML readings are None here):
the TTFT probes run and the table names every configuration."""
from __future__ import annotations

import json

import pytest

from blink.bench import idle_power

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_host_mode_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert idle_power.main(["--model", "demo", "--configs", "host", "--idle-seconds", "0.5", "--settle-s", "0.2",
                            "--idle-before-s", "0.2", "--probes", "2", "--port", "8931", "--log-dir", str(tmp_path),
                            "--result-json", str(out)]) == 0
    result = json.loads(out.read_text())
    row = result["configs"][0]
    assert row["config"] == "host" and len(row["ttft_after_idle_ms"]) == 2
    assert all(0 < t < 60_000 for t in row["ttft_after_idle_ms"] + row["ttft_warm_ms"])
    assert "host " in capsys.readouterr().out
