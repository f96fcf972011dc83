"""BlinkServer, the interference lab's handle on `blink serve`: a SIGTERM to the benchmark stops the server
it started (the server runs in a session of its own, so the signal would not reach it by itself)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.frontend.server_process import make_tokenizer_only_model

pytestmark = pytest.mark.slow  # spawns processes

BENCH = textwrap.dedent("""
    import sys, time
    from blink.bench.server_process import BlinkServer, ServeSpec
    spec = ServeSpec(engine="host", model=sys.argv[1], port=int(sys.argv[2]),
                     extra_args=("--engine-module", "blink.bench.null_engine"))
    with BlinkServer(spec, sys.argv[3], ready_timeout_s=120) as server:
        print(server._proc.pid, flush=True)
        time.sleep(600)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_to_the_benchmark_stops_its_server(tmp_path):
    model = make_tokenizer_only_model(tmp_path / "model")
    bench = subprocess.Popen([sys.executable, "-c", BENCH, str(model), str(free_port()), str(tmp_path / "s.log")],
                             stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    server_pid = int(bench.stdout.readline())
    assert alive(server_pid)
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server_pid)
