"""The `blink serve` process model: readiness, pinning, failed starts, shutdown, no orphans."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.frontend.server_process import ServerProcess, make_tokenizer_only_model

pytestmark = pytest.mark.slow  # spawns processes

FAKE = ["--engine-module", "tests.frontend.fake_engine"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tokenizer_only_model(tmp_path_factory.mktemp("proc"))


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def engine_and_frontend(proc: ServerProcess) -> tuple[int, int]:
    pids = proc.children()
    assert len(pids) == 2, [cmdline(p) for p in pids]
    engine = next(p for p in pids if "fake_engine" in cmdline(p) or "blink.entrypoints.engine_process" in cmdline(p))
    return engine, next(p for p in pids if p != engine)


def gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]
              for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_to_server_shuts_down_cleanly(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE])
    proc.wait_ready()
    pids = proc.children()
    assert len(pids) == 2 and len(proc.segments()) == 1
    assert httpx.get(proc.base_url + "/health").status_code == 200
    proc.process.send_signal(signal.SIGTERM)
    assert proc.wait_exit(20) == 0
    assert gone(pids, 1) and proc.children() == [] and proc.segments() == []


@pytest.mark.slow
def test_drain_cuts_a_stream_at_the_shutdown_timeout(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--shutdown-timeout", "1"],
                         env={"FAKE_ENGINE_STEP_S": "0.05"})
    proc.wait_ready()
    pids = proc.children()
    body = {"prompt": "one two", "max_tokens": 240, "stream": True}  # 12 s of tokens: longer than the drain
    with httpx.stream("POST", proc.base_url + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        start = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        rest = list(lines)  # the stream ends with an error event instead of hanging
    assert proc.wait_exit(20) == 0 and time.monotonic() - start < 20
    events = [line for line in rest if line]
    assert events[-1] == "data: [DONE]", events[-3:]
    error = json.loads(events[-2][len("data: "):])["error"]
    assert error["code"] == 503 and "server shutting down" in error["message"], error
    assert len(events) > 3  # tokens kept coming during the drain second
    assert gone(pids, 1) and proc.segments() == []


@pytest.mark.slow
def test_drain_finishes_streams_and_refuses_new_requests(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--shutdown-timeout", "30"],
                         env={"FAKE_ENGINE_STEP_S": "0.05"})
    proc.wait_ready()
    pids = proc.children()
    body = {"prompt": "one two", "max_tokens": 40, "stream": True}  # 2 s of tokens
    with httpx.stream("POST", proc.base_url + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while httpx.get(proc.base_url + "/health").status_code != 503:  # at once, give or take a poll
            assert time.monotonic() < deadline, "/health did not turn 503"
            time.sleep(0.02)
        refused = httpx.post(proc.base_url + "/v1/completions", json={"prompt": "one", "max_tokens": 2})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in rest[:-1]]
    assert not any("error" in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert proc.wait_exit(20) == 0
    assert "drained in" in "".join(proc.stderr)
    assert gone(pids, 1) and proc.segments() == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_cpu_pinning(model_dir):
    cpus = sorted(os.sched_getaffinity(0))
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--engine-cpus", str(cpus[0]),
                          "--frontend-cpus", str(cpus[1])])
    try:
        proc.wait_ready()
        engine, frontend = engine_and_frontend(proc)
        assert os.sched_getaffinity(engine) == {cpus[0]}
        assert os.sched_getaffinity(frontend) == {cpus[1]}
    finally:
        proc.stop()


def test_niceness(model_dir):
    """--frontend-nice / --engine-nice reach every thread of their process (set before the first thread)."""
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--engine-nice", "3", "--frontend-nice", "5"])
    try:
        proc.wait_ready()
        engine, frontend = engine_and_frontend(proc)
        assert os.getpriority(os.PRIO_PROCESS, engine) == 3
        threads = [int(t) for t in os.listdir(f"/proc/{frontend}/task")]
        assert len(threads) > 1 and all(os.getpriority(os.PRIO_PROCESS, t) >= 5 for t in threads)
        assert os.getpriority(os.PRIO_PROCESS, frontend) == 5  # the event loop's thread
    finally:
        proc.stop()


def test_children_die_with_a_killed_server(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE])
    proc.wait_ready()
    pids = proc.children()
    segments = proc.segments()
    proc.process.kill()
    proc.wait_exit(5)
    try:
        assert gone(pids, 10), "orphaned children"
    finally:
        for path in segments:  # nobody is left to unlink it after a SIGKILL
            Path(path).unlink(missing_ok=True)


def test_engine_death_stops_the_server(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE])
    proc.wait_ready()
    engine, frontend = engine_and_frontend(proc)
    os.kill(engine, signal.SIGKILL)
    assert proc.wait_exit(20) == 1
    assert gone([frontend], 1) and proc.segments() == []
    assert any("engine exited unexpectedly" in line for line in proc.stderr)


@pytest.mark.parametrize("engine", ["fake", "real"])
def test_failed_start_is_one_line_and_exit_2(tmp_path, engine):
    if engine == "fake":  # the fake engine refuses a model dir named *missing-model
        args = ["--model", str(make_tokenizer_only_model(tmp_path / "missing-model")), *FAKE]
    else:
        args = ["--model", str(make_tokenizer_only_model(tmp_path / "no-weights")), "--engine", "host",
                "--device", "cpu"]
    proc = ServerProcess(args)
    assert proc.wait_exit(60) == 2
    time.sleep(0.2)  # let the reader threads drain the pipes
    lines = [line for line in proc.stderr if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("blink serve: error: "), lines
    assert proc.children() == [] and proc.segments() == []


def test_a_stream_interval_below_one_is_one_line_and_exit_2(model_dir):
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--stream-interval", "0"])
    assert proc.wait_exit(60) == 2
    time.sleep(0.2)
    lines = [line for line in proc.stderr if line.strip()]
    assert lines == ["blink serve: error: --stream-interval must be at least 1, got 0\n"], lines


def test_the_stream_interval_reaches_the_front_end(model_dir):
    # one token a 20 ms step: the front end keeps up, so each chunk is the interval's doing, not a catch-up
    proc = ServerProcess(["--model", str(model_dir), *FAKE, "--stream-interval", "4"],
                         env={"FAKE_ENGINE_STEP_S": "0.02"})
    try:
        proc.wait_ready()
        body = {"prompt": "one two three", "max_tokens": 10, "ignore_eos": True}
        whole = httpx.post(proc.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
        with httpx.stream("POST", proc.base_url + "/v1/completions", json={**body, "stream": True},
                          timeout=30) as response:
            events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        # vLLM's request field overrides the server's interval for one request
        with httpx.stream("POST", proc.base_url + "/v1/completions",
                          json={**body, "stream": True, "stream_interval": 1}, timeout=30) as response:
            per_token = [line for line in response.iter_lines() if line.startswith("data: {")]
        refused = httpx.post(proc.base_url + "/v1/completions", json={**body, "stream_interval": 0}, timeout=30)
    finally:
        proc.stop()
    assert events[-1] == "[DONE]"
    # tokens 1 | 2-5 | 6-9 | 10 (the finish)
    assert len(chunks) == 4 and [c["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert "".join(c["text"] for c in chunks) == whole and whole
    assert len(per_token) == 10
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream_interval", refused.text


def test_a_start_stopped_by_a_signal_shows_how_far_it_got(model_dir):
    """A benchmark that gives up on a slow start (SIGINT, as the interference lab's BlinkServer sends) gets
    the held start-up lines, so the log says which phase the time went to."""
    proc = ServerProcess(["--model", str(model_dir), *FAKE], env={"FAKE_ENGINE_START_S": "30"})
    deadline = time.monotonic() + 20
    while len(proc.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)  # the fake engine has printed its phase line and sleeps
    proc.process.send_signal(signal.SIGINT)
    assert proc.wait_exit(20) == 0
    time.sleep(0.2)  # let the reader threads drain the pipes
    assert any("blink engine: +" in line and "fake model built" in line for line in proc.stderr), proc.stderr
    assert proc.children() == [] and proc.segments() == []
