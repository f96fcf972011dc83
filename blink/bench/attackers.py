"""CPU interference on chosen cores: `blink bench attack` and the `Attackers` context manager.

Kinds: spin (busy loops), memory (streams over buffers larger than the LLC), compile (many short-lived
CPU-bound processes), tokenize (long prompts tokenized in a loop). Each of the `procs` processes is
pinned to one core of `cpus`, round robin, so `procs = 2 x len(cpus)` oversubscribes every core twice.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from blink.util.cpus import format_cpu_list, parse_cpu_list
from blink.util.processes import StopSignals

KINDS = ("spin", "memory", "compile", "tokenize")


def optional_cpu_list(text: str | None) -> list[int] | None:
    """A CPU list flag that may be left out: None or '' -> None."""
    return parse_cpu_list(text) if text else None


def llc_bytes() -> int:
    """Size of the largest CPU cache (the LLC) from sysfs; 32 MiB when sysfs does not say."""
    sizes = []
    cache_dir = "/sys/devices/system/cpu/cpu0/cache"
    for index in os.listdir(cache_dir) if os.path.isdir(cache_dir) else []:
        try:
            with open(os.path.join(cache_dir, index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def default_buffer_mib(procs: int) -> int:
    """Two buffers of 2x the LLC each per process, but all processes together within a quarter of RAM."""
    wanted = 4 * llc_bytes()
    allowed = available_memory_bytes() // 4 // max(1, procs)
    return max(1, min(wanted, allowed) >> 20)


def read_line(proc: subprocess.Popen, deadline: float) -> bytes:
    """Read a worker's unbuffered stdout up to its first newline (or its exit, or the deadline)."""
    data = b""
    fd = proc.stdout.fileno()
    while b"\n" not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if ready and not chunk:  # end of file: the worker exited
            break
        data += chunk
    return data


@dataclass(frozen=True)
class AttackSpec:
    kind: str
    procs: int
    duration_s: float
    cpus: tuple[int, ...] | None = None  # None = unpinned
    tokenizer: str | None = None  # tokenize kind: a tokenizer.json (default: a small BPE trained at start)
    buffer_mib: int | None = None  # memory kind: per-process footprint (default: default_buffer_mib)
    nice: int | None = None  # sched_knobs: applied by each worker to itself
    policy: str | None = None
    cgroup: str | None = None  # a directory made by sched_knobs.AttackCgroup

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown attack kind {self.kind!r}; one of {KINDS}")
        if self.procs < 1 or self.duration_s <= 0:
            raise ValueError("an attack needs procs >= 1 and a positive duration")


class Attackers:
    """Start the attack processes on enter, stop them (SIGTERM, then SIGKILL) on exit.

    Start it from a thread that outlives the attack (the main thread): the workers die with the thread
    that created them (PR_SET_PDEATHSIG), so they never outlive a crashed parent.
    """

    def __init__(self, spec: AttackSpec):
        self.spec = spec
        self._procs: list[subprocess.Popen] = []
        self._early_output: dict[int, bytes] = {}  # what start() read of each worker's stdout
        self.reports: list[dict] = []

    def worker_command(self, index: int) -> list[str]:
        spec = self.spec
        cmd = [sys.executable, "-m", "blink.bench.attack_worker", "--kind", spec.kind,
               "--seconds", str(spec.duration_s), "--parent-pid", str(os.getpid())]
        if spec.cpus:
            cmd += ["--cpu", str(spec.cpus[index % len(spec.cpus)])]
        if spec.kind == "memory":
            cmd += ["--buffer-mib", str(spec.buffer_mib or default_buffer_mib(spec.procs))]
        if spec.tokenizer:
            cmd += ["--tokenizer", spec.tokenizer]
        for flag, value in (("--nice", spec.nice), ("--sched", spec.policy), ("--cgroup", spec.cgroup)):
            if value is not None:
                cmd += [flag, str(value)]
        return cmd

    def start(self, ready_timeout_s: float = 60.0) -> Attackers:
        """Start every worker; return once each is set up and attacking (its duration starts then)."""
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for index in range(self.spec.procs):
            self._procs.append(subprocess.Popen(
                self.worker_command(index), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env, bufsize=0, process_group=0))  # its jobs join its group
        deadline = time.monotonic() + ready_timeout_s
        for proc in self._procs:
            self._early_output[proc.pid] = read_line(proc, deadline)
        broken = [proc.pid for proc in self._procs if not self._early_output[proc.pid].startswith(b"ready")]
        if broken:  # a bad --cpus, a missing tokenizer...: no silent "attack" that never ran
            reports = self.stop()
            errors = {(r.get("error") or "").strip().rpartition("\n")[2] or f"exit {r['returncode']}"
                      for r in reports if r["pid"] in broken}
            raise RuntimeError(f"attack workers {broken} failed to start: {errors}")
        return self

    def wait(self) -> list[dict]:
        """Wait until every worker has reached its deadline by itself."""
        return self._collect(timeout_s=self.spec.duration_s + 60.0)

    def stop(self, grace_s: float = 5.0) -> list[dict]:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return self._collect(timeout_s=grace_s)

    def _collect(self, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while self._procs:  # popped only once collected, so an interrupted wait can be resumed by stop()
            proc = self._procs[0]
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out, err = self._kill(proc)
            out = (self._early_output.pop(proc.pid, b"") + out).decode(errors="replace")
            report = {"pid": proc.pid, "returncode": proc.returncode}
            lines = [line for line in out.splitlines() if line.startswith("{")]
            report.update(json.loads(lines[-1]) if lines else {"error": err.decode(errors="replace")[-500:]})
            self.reports.append(report)
            self._procs.pop(0)
        return self.reports

    @staticmethod
    def _kill(proc: subprocess.Popen) -> tuple[bytes, bytes]:
        """SIGKILL a worker and its process group: a job it started holds its pipes open, so reading them
        to the end would wait on the job too. Bounded even if something outside the group holds them."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
            proc.wait()
            return b"", b"pipes held open after SIGKILL"

    @property
    def pids(self) -> list[int]:
        """The workers not yet collected."""
        return [proc.pid for proc in self._procs]

    @property
    def running(self) -> int:
        return sum(proc.poll() is None for proc in self._procs)

    def __enter__(self) -> Attackers:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--cpus", default=None, help="cores to pin to, round robin, e.g. 0-3,8 (default: none)")
    p.add_argument("--duration", type=float, required=True, help="seconds")
    p.add_argument("--tokenizer", default=None, help="tokenize kind: a tokenizer.json or a dir holding one")
    p.add_argument("--buffer-mib", type=int, default=None, help="memory kind: MiB per process")
    p.add_argument("--nice", type=int, default=None, help="niceness added to each attack process")
    p.add_argument("--sched", choices=("batch", "idle"), default=None, help="their scheduling policy")


def print_reports(reports: list[dict]) -> None:
    table = Table(title="Attack processes")
    for column in ("pid", "kind", "cpu", "nice", "policy", "seconds", "iterations", "returncode"):
        table.add_column(column)
    for r in reports:
        seconds = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        table.add_row(str(r["pid"]), str(r.get("kind", "-")), str(r.get("cpu")), str(r.get("nice", "-")),
                      str(r.get("policy", "-")), seconds,
                      str(r.get("iterations", r.get("error", "-"))), str(r["returncode"]))
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    cpus = optional_cpu_list(args.cpus)
    spec = AttackSpec(kind=args.kind, procs=args.procs, duration_s=args.duration,
                      cpus=tuple(cpus) if cpus else None, tokenizer=args.tokenizer,
                      buffer_mib=args.buffer_mib, nice=args.nice, policy=args.sched)
    attackers = Attackers(spec)
    # SIGTERM/SIGINT only count (StopSignals says why). The handlers stay for the rest of the process (this
    # is the CLI command's), so a repeated signal cannot cut the stop short
    stopping = StopSignals(poll_s=0.1)
    stopping.install()
    try:
        attackers.start()
    except RuntimeError as exc:
        print(f"blink bench attack: error: {exc}", file=sys.stderr)
        return 1
    print(f"attacking: {spec.procs} {spec.kind} processes on cpus "
          f"{format_cpu_list(cpus) or 'any'} for {spec.duration_s:g} s", flush=True)
    while attackers.running and not stopping.wait(0.1):
        pass
    reports = attackers.stop() if stopping.requested else attackers.wait()
    print_reports(reports)
    return 0 if all(r["returncode"] == 0 for r in reports) else 1
