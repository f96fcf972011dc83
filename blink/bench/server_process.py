"""Start `blink serve` for one engine mode, wait until it is healthy, find its engine pid, stop it."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import httpx

from blink.bench.host_cpu import engine_pid_from_metrics
from blink.bench.stop_signal import no_signal


@dataclass(frozen=True)
class ServeSpec:
    """The `blink serve` flags the interference lab sets (engine args have vLLM's names)."""

    engine: str  # device | host
    model: str | None = None
    tokenizer: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    frontend_cpus: str | None = None
    engine_cpus: str | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)  # anything else, passed through verbatim

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        # A benchmark's point is over when the server stops: no drain beyond a few seconds.
        cmd = [sys.executable, "-m", "blink", "serve", "--engine", self.engine,
               "--host", self.host, "--port", str(self.port), "--shutdown-timeout", "5"]
        options = {"--model": self.model, "--tokenizer": self.tokenizer, "--dtype": self.dtype,
                   "--max-model-len": self.max_model_len, "--max-num-seqs": self.max_num_seqs,
                   "--max-num-batched-tokens": self.max_num_batched_tokens,
                   "--frontend-cpus": self.frontend_cpus, "--engine-cpus": self.engine_cpus}
        for flag, value in options.items():
            if value is not None:
                cmd += [flag, str(value)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + list(self.extra_args)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


class BlinkServer:
    """Context manager: `blink serve` in its own session, its output in `log_path`.

    The server is in a session of its own, so a SIGTERM to the benchmark (`timeout`, say) would not reach
    it: while one is open, SIGTERM raises SystemExit in the benchmark, whose `with` then stops the server
    instead of leaving it to hold the GPU for whatever runs next (2026-12-01: a 30B server outlived its
    benchmark's timeout and the next stage ran out of GPU memory)."""

    def __init__(self, spec: ServeSpec, log_path: str, ready_timeout_s: float = 900.0,
                 interruptible: Callable[[], AbstractContextManager] = no_signal):
        """interruptible: the caller's SIGTERM guard for the health polls (stop_signal.TermSignal.interruptible)."""
        self.spec = spec
        self.interruptible = interruptible
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.engine_pid: int | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> BlinkServer:
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        self._old_sigterm = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        with open(self.log_path, "w") as log:
            log.write("$ " + shlex.join(self.spec.command()) + "\n")
            log.flush()
            # Its own session, so that a stuck server and all its children can be killed as a group.
            self._proc = subprocess.Popen(self.spec.command(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with self.interruptible():
                self.wait_ready()
            self.engine_pid = engine_pid_from_metrics(self.spec.base_url)
        except BaseException:
            self.__exit__()
            raise
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"blink serve exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.spec.base_url + "/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"blink serve not healthy after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (blink serve tears its processes down), then SIGKILL what is left of its session."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # stragglers (an engine that ignored the teardown) would hold the GPU for the next mode
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._proc = None

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
