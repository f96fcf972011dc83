"""One point of the interference lab: start the attackers, send the time-boxed load, record everything.

A point's record holds the bench metrics, the engine's host CPU seconds per 1k output tokens, GPU (and CPU) energy
per output token, mean GPU utilisation and power, the attackers' real scheduling settings, the front end's
collections, loop lags and egress gaps (server_stalls.py), and the raw per-request latencies
(result_folder.raw_requests).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import httpx

from blink.bench.attackers import Attackers, AttackSpec
from blink.bench.code_version import code_version
from blink.bench.cpu_energy import CpuEnergyMeter
from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.host_cpu import CpuMeter
from blink.bench.result_folder import ISOLATED, raw_requests
from blink.bench.runner import requests_for_window, run_load
from blink.bench.sched_knobs import AttackerKnobs
from blink.bench.serve import load_config, run_config
from blink.bench.server_stalls import engine_delta, gc_delta, read_server, stall_delta
from blink.bench.stop_signal import no_signal
from blink.util.cpus import format_cpu_list


@contextlib.contextmanager
def pinned(cpus: list[int] | None):
    """Run the load generator (this thread and the threads it starts) on `cpus`, then restore."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def reset_prefix_cache(base_url: str) -> bool:
    """Forget the server's cached prefixes: every point replays the same prompts, so without this a point
    would be served from the blocks of the points (and the warm-up) before it. False where the server has
    no such endpoint (the HF peer) or it failed."""
    try:
        return httpx.post(base_url.rstrip("/") + "/reset_prefix_cache", timeout=15.0).status_code == 200
    except httpx.HTTPError:
        return False


def attack_tokenizer(args: argparse.Namespace) -> str | None:
    for path in (args.tokenizer, args.model):
        if path and os.path.isfile(os.path.join(path, "tokenizer.json")):
            return os.path.join(path, "tokenizer.json")
    return None


@dataclass
class Sweep:
    """What stays fixed while one server's points are measured."""

    args: argparse.Namespace
    layout: str
    target: str
    base_url: str
    model: str
    engine_pid: int | None
    attack_cpus: list[int]
    client_cpus: list[int] | None
    frontend_cpus: list[int] | None
    server_command: str | None
    gpu: GpuMonitor
    knobs: AttackerKnobs
    cgroup: str | None = None  # the attackers' cgroup directory (knobs.cpu_weight), made by the caller
    variant: str = ""
    interruptible: Callable[[], AbstractContextManager] = no_signal  # waits SIGTERM may cut (stop_signal.py)


def measure_point(sweep: Sweep, requests: list, rate: float, kind: str, level: float) -> dict:
    args, knobs = sweep.args, sweep.knobs
    procs = max(1, round(level * len(sweep.attack_cpus))) if kind != ISOLATED else 0
    attack = None
    if procs:
        attack = Attackers(AttackSpec(
            kind=kind, procs=procs, cpus=tuple(sweep.attack_cpus), tokenizer=attack_tokenizer(args),
            duration_s=args.attack_settle_seconds + args.point_seconds + args.drain_seconds + 60.0,
            nice=knobs.nice, policy=knobs.policy, cgroup=sweep.cgroup))
    config = load_config(args, sweep.base_url, sweep.model, rate, args.point_seconds, args.drain_seconds)
    cpu, cpu_energy = CpuMeter(sweep.engine_pid), CpuEnergyMeter()
    cache_reset = reset_prefix_cache(sweep.base_url)
    server_before = read_server(sweep.base_url)
    try:
        if attack:
            attack.start()
            with sweep.interruptible():
                time.sleep(args.attack_settle_seconds)
        cpu.start()
        cpu_energy.start()
        sweep.gpu.start()
        with pinned(sweep.client_cpus), sweep.interruptible():
            outcome = asyncio.run(run_load(config, requests[: requests_for_window(rate, args.point_seconds)]))
        gpu = sweep.gpu.stop()
        cpu_seconds, cpu_mj = cpu.stop(), cpu_energy.stop()
        attackers_alive = attack.running if attack else 0
    finally:
        reports = attack.stop() if attack else []
    server_after = read_server(sweep.base_url)
    bench = outcome.summary()
    tokens = bench["total_output_tokens"]
    streamed = bench.get("streamed_output_tokens")  # every token received, cancelled requests' too (runner.py)
    per_token = lambda total, scale, count=tokens: total * scale / count if total is not None and count else None
    return {
        "mode": sweep.target, "layout": sweep.layout, "attack_kind": kind, "attack_level": level,
        "variant": sweep.variant, "attack_procs": procs,
        "attack_cpus": format_cpu_list(sweep.attack_cpus) if procs else "",
        "attackers_alive_at_end": attackers_alive, "prefix_cache_reset": cache_reset,
        "request_rate": rate, "point_seconds": args.point_seconds,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "base_url": sweep.base_url, "model": sweep.model, "server_command": sweep.server_command,
        "client_cpus": format_cpu_list(sweep.client_cpus), "frontend_cpus": format_cpu_list(sweep.frontend_cpus),
        "engine_pid": sweep.engine_pid, "engine_cpu_seconds": cpu_seconds,
        "engine_cpu_s_per_1k_tokens": per_token(cpu_seconds, 1000),
        "gpu_energy_mj": gpu.energy_mj, "energy_per_output_token_mj": per_token(gpu.energy_mj, 1),
        "energy_per_streamed_token_mj": per_token(gpu.energy_mj, 1, streamed),
        "gpu_mean_utilization_pct": gpu.mean_utilization_pct, "gpu_mean_power_w": gpu.mean_power_w,
        # the CPU packages' energy (RAPL; None without a readable counter): the whole machine's CPUs, both modes alike
        "cpu_energy_mj": cpu_mj, "cpu_energy_per_streamed_token_mj": per_token(cpu_mj, 1, streamed),
        # the front end's collections, loop lags, egress gaps and the engine's steps during the load and its drain
        "frontend_gc": gc_delta(server_before.gc, server_after.gc),
        "frontend_stalls": stall_delta(server_before.stalls, server_after.stalls),
        "engine_steps": engine_delta(server_before.engine, server_after.engine),  # steps, tokens per step
        "attacker_knobs": {**knobs.as_dict(), "cgroup": sweep.cgroup},
        "attackers": [{k: r.get(k) for k in ("cpu", "iterations", "returncode", "nice", "policy", "cgroup")}
                      for r in reports],
        "drain_seconds": args.drain_seconds, "attack_settle_seconds": args.attack_settle_seconds,
        "workload": run_config(args, sweep.base_url, sweep.model, rate),
        "bench": bench,
        "requests": raw_requests(outcome.results),
        "client_stalls": outcome.client_stalls(),  # the load generator's own loop lags and collections
        "code": code_version(),  # repeats merge across sessions: which source measured this one
    }
