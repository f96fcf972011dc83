"""Start `blink serve` (python -m blink serve) as a subprocess for end-to-end tests."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from blink.model.demo import build_tokenizer, write_tokenizer_files

READY_MARK = "blink serve: ready on "


def make_tokenizer_only_model(path: Path, max_position_embeddings: int = 256) -> Path:
    """A model dir with the demo tokenizer and a config.json, no weights: enough for the fake engine."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    write_tokenizer_files(tokenizer, path)
    config = {"vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": max_position_embeddings}
    (path / "config.json").write_text(json.dumps(config))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], env: dict | None = None, new_session: bool = False):
        self.args = list(args)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "blink", "serve", "--port", str(self.port), *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})}, start_new_session=new_session)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, args=(self.process.stdout, self.stdout), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self.stderr), daemon=True).start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)
            if line.startswith(READY_MARK):
                self._ready.set()

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start (rc={self.process.returncode}):\n"
                                   + "".join(self.stderr[-30:]))

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def children(self) -> list[int]:
        """Pids of processes started for this server (their command lines carry its segment name)."""
        mark = f"blink-{self.process.pid}-".encode()
        pids = []
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                if mark in Path(cmdline).read_bytes():
                    pids.append(int(cmdline.split("/")[2]))
            except OSError:
                pass
        return pids

    def segments(self) -> list[str]:
        return glob.glob(f"/dev/shm/blink-{self.process.pid}-*")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(25)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
