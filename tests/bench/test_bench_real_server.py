"""`blink bench serve` end to end against the real `blink serve` (host engine, tiny model, CPU)."""
import json
import subprocess
import sys

import pytest

from tests.frontend.server_process import ServerProcess
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("bench"), "llama")
    proc = ServerProcess(["--model", str(model_dir), "--served-model-name", "tiny", "--engine", "host",
                          "--device", "cpu", "--max-num-seqs", "8"])
    proc.wait_ready()
    yield proc, model_dir
    proc.stop()


@pytest.mark.parametrize("tokenizer", ["local", "server"])
def test_bench_serve_against_blink_serve(server, tmp_path, tokenizer):
    proc, model_dir = server
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "blink", "bench", "serve", "--base-url", proc.base_url, "--num-prompts", "10",
           "--request-rate", "50", "--random-input-len", "24", "--random-output-len", "8", "--ignore-eos",
           "--seed", "3", "--disable-tqdm", "--result-json", str(out)]
    if tokenizer == "local":
        cmd += ["--model", "tiny", "--tokenizer", str(model_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"]) == (10, 0)
    assert result["total_output_tokens"] == 10 * 8  # from the server's usage, with ignore_eos
    assert 10 * 24 <= result["total_input_tokens"] <= 10 * 25  # the exact length, plus a BOS if added
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{name}_ms"] <= result[f"p99_{name}_ms"]
