"""The real vllm-router (pip: vllm-router) as a subprocess in front of blink replicas, for the tests and
tools/route_policies.py."""
from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROUTER = Path(sys.executable).with_name("vllm-router")  # the console script the wheel installs


class Router:
    def __init__(self, worker_urls: list[str], policy: str, extra_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        # Short intervals: the load monitor (power_of_two) and the health checker poll every second.
        command = [str(ROUTER), "--worker-urls", *worker_urls, "--policy", policy, "--port", str(self.port),
                   "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1",
                   "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                   "--log-level", "warning", *extra_args]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _ok(self.base_url + "/health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"the router did not start:\n{self.log.read().decode()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.log.close()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generated_tokens(base_url: str) -> int:
    """Tokens the replica's engine generated so far (from its control block, via /get_server_info)."""
    return httpx.get(base_url + "/get_server_info", timeout=5).json()["generated_tokens"]
