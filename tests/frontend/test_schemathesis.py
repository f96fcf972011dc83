"""Schemathesis fuzzes the API from its own /openapi.json on a bounded budget: no 5xx, and the server is
still healthy afterwards (issue 18, "How it is verified")."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

pytestmark = pytest.mark.slow
MAX_EXAMPLES = 40  # per operation; about 15 s on a 2-core CPU
API_PATHS = "^/(v1/|tokenize|detokenize)"


def schemathesis_command() -> list[str]:
    exe = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    if not Path(exe).exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    return [exe]


def test_fuzzed_api_has_no_server_errors(tmp_path):
    command = schemathesis_command()
    model = make_tokenizer_only_model(tmp_path / "model")
    server = ServerProcess(["--model", str(model), "--engine-module", "tests.frontend.fake_engine",
                            "--disable-log-requests"])
    try:
        server.wait_ready()
        run = subprocess.run([*command, "run", server.base_url + "/openapi.json", "--checks", "not_a_server_error",
                              "--max-examples", str(MAX_EXAMPLES), "--include-path-regex", API_PATHS,
                              "--phases", "examples,coverage,fuzzing", "--request-timeout", "20", "--seed", "18",
                              "--no-color"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
        health = httpx.get(server.base_url + "/health", timeout=10).status_code
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "passed" in run.stdout and "generated" in run.stdout
    assert health == 200
