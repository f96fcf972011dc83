"""`blink serve --tensor-parallel-size 2 --engine host` on the CPU: the engine process is rank 0 and
starts rank 1; completions equal the offline TP=1 engine's, and stopping the server leaves no process behind."""
from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from blink.entrypoints.llm import LLM
from blink.request import SamplingParams
from tests.frontend.server_process import ServerProcess
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

PROMPT = [5, 6, 7, 8, 9, 10, 11]  # token ids, so that both sides see the same prompt


def _descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _serve_and_complete(path, tp: int) -> str:
    """Start a server, complete PROMPT greedily, stop it; checks that no process it started survives."""
    server = ServerProcess(["--model", str(path), "--served-model-name", "tiny", "--engine", "host",
                            "--device", "cpu", "--tensor-parallel-size", str(tp), "--num-kv-blocks", "64"])
    try:
        server.wait_ready()
        processes = _descendants(server.process.pid)
        assert len(processes) >= 1 + tp  # front end, engine (rank 0), ranks 1..tp-1
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                        extra_body={"ignore_eos": True})
    finally:
        server.stop()
    assert server.process.returncode == 0
    deadline = time.monotonic() + 10
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(processes)
    return got.choices[0].text


def _alive(pids: set[int]) -> set[int]:
    return pids & {int(p.name) for p in Path("/proc").glob("[0-9]*")}


def test_serve_tp2_matches_offline_tp1(tmp_path):
    path = make_tiny_model(tmp_path, "llama")
    llm = LLM(str(path), device="cpu", num_kv_blocks=64)
    want = llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].text
    assert _serve_and_complete(path, 2) == want
