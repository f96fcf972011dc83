"""Measure a sweep plan: per repeat, per server group, start the server (or reach the external one),
sample its idle GPU power, warm it up, then measure its points in the plan's order and save each repeat."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import time
import traceback

import httpx
from rich.console import Console

from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.host_cpu import engine_pid_from_metrics
from blink.bench.interference_point import Sweep, measure_point
from blink.bench.interference_report import write_report
from blink.bench.interference_targets import Placement, Target, served_model_name
from blink.bench.result_folder import save_repeat, save_run
from blink.bench.runner import LoadConfig, run_load
from blink.bench.sched_knobs import AttackerKnobs
from blink.bench.serve import build_requests, constraint_body
from blink.bench.server_process import BlinkServer
from blink.bench.stop_signal import TermSignal
from blink.bench.sweep_plan import Group, Repeat

clock = time.monotonic  # the time budget's clock (a test steps it)


def measure_group(args: argparse.Namespace, console: Console, repeat: Repeat, group: Group, target: Target,
                  where: Placement, gpu: GpuMonitor, knobs: AttackerKnobs, cgroup: str | None,
                  variant: str, run_id: str, requests: list, num_requests: int, metadata: dict,
                  deadline: float, starts: dict[str, list[float]], term: TermSignal) -> tuple[int, int]:
    """One server start and its points, as many as fit before `deadline` (monotonic; the estimate's
    point cost is what one more must fit in); returns (points failed outright, points measured). The
    seconds the server took to start are appended to `starts[group.mode]`."""
    with contextlib.ExitStack() as stack:
        base_url, pid, command = target.base_url, target.engine_pid, None
        if target.serve is not None:
            log = os.path.join(args.result_dir, "logs",
                               f"server-{run_id}-r{repeat.index}-{group.layout}-{target.name}.log")
            began = clock()
            server = stack.enter_context(BlinkServer(target.serve, log, args.server_timeout, term.interruptible))
            starts.setdefault(group.mode, []).append(clock() - began)
            base_url, pid = target.serve.base_url, server.engine_pid
            command = shlex.join(target.serve.command())
        elif pid is None:
            with contextlib.suppress(Exception):
                pid = engine_pid_from_metrics(base_url)
        model = served_model_name(base_url, args.model)
        if not requests:
            requests += build_requests(args, base_url, model, num_requests)
        # The resident scheduler's idle draw, before any request: the number the energy work lowers.
        with term.interruptible():
            idle = gpu.idle_power(args.idle_power_seconds)
        metadata.setdefault("server_idle_power", []).append(
            {"repeat": repeat.index, "layout": group.layout, "mode": group.mode, **idle})
        save_run(args.result_dir, run_id, metadata)
        warmup = LoadConfig(base_url=base_url, model=model, ignore_eos=args.ignore_eos,
                            temperature=args.temperature, show_progress=False, extra_body=constraint_body(args))
        with term.interruptible():
            asyncio.run(run_load(warmup, requests[: args.warmup_requests]))
        if pid is None:
            console.print(f"[yellow]{group.layout}/{target.name}: no engine pid, host CPU cost not "
                          f"measured[/yellow]")
        sweep = Sweep(args=args, layout=group.layout, target=target.name, base_url=base_url, model=model,
                      engine_pid=pid, attack_cpus=where.attack_cpus, client_cpus=where.client_cpus,
                      frontend_cpus=where.frontend_cpus, server_command=command, gpu=gpu, knobs=knobs,
                      cgroup=cgroup, variant=variant, interruptible=term.interruptible)
        failures = measured = 0
        for spec in group.points:
            term.check()
            if clock() + args.point_cost_s > deadline:
                break
            point = measure_point(sweep, requests, spec.rate, spec.attack_kind, spec.attack_level)
            point.update(run_id=run_id, repeat=repeat.index, server_idle_power_w=idle["mean_w"], gpu=gpu.name)
            save_repeat(args.result_dir, point)
            write_report(args.result_dir, plots=False)  # the plots: once, when the run ends (interference.py)
            b = point["bench"]
            console.print(f"[bold]r{repeat.index} {group.layout}/{target.name}[/bold] {spec.attack_kind} "
                          f"x{spec.attack_level:g} rate {spec.rate:g}: {b['completed']} done, {b['failed']} "
                          f"failed, {b['output_throughput']:.1f} tok/s, P99 TTFT {b['p99_ttft_ms']:.1f} ms, "
                          f"P99 TPOT {b['p99_tpot_ms']:.2f} ms")
            failures += b["completed"] == 0
            measured += 1
        return failures, measured


def start_estimate(flag_s: float, starts: dict[str, list[float]], mode: str) -> float:
    """Seconds the next start of `mode` should take. A fresh machine's first starts compile every kernel
    (160-200 s on the H200, 2026-12-01) and later ones reuse the caches (under a minute, 2026-12-03), so: the last
    start of this mode in this call; a mode not started yet, 1.5x the slowest mode's last start (device mode also
    builds its scheduler); before any start, the --server-start-s estimate. Charging 240 s for every start of a
    warm machine stopped a chunk after 216 s of its 470 (2026-12-03)."""
    if starts.get(mode):
        return starts[mode][-1]
    if starts:
        return 1.5 * max(seen[-1] for seen in starts.values())
    return flag_s


def run_plan(args: argparse.Namespace, console: Console, repeats: list[Repeat],
             by_name: dict[str, dict[str, Target]], placements: dict[str, Placement], gpu: GpuMonitor,
             knobs: AttackerKnobs, cgroup: str | None, variant: str, run_id: str, num_requests: int,
             metadata: dict, term: TermSignal) -> int:
    """Every repeat's groups in order; a group that fails (server dead, port refused) is counted and
    reported, and the sweep goes on with the next."""
    requests: list = []  # built once, from the first server reached (it may be the tokenizer)
    budget = args.time_budget_s
    deadline = clock() + budget if budget else float("inf")
    failures = measured = 0
    total = sum(len(g.points) for r in repeats for g in r.groups)
    starts: dict[str, list[float]] = {}  # per mode, this call's server starts in seconds
    for repeat in repeats:
        for group in repeat.groups:
            if clock() + start_estimate(args.server_start_s, starts, group.mode) + args.point_cost_s > deadline:
                break
            name = f"r{repeat.index} {group.layout}/{group.mode}"
            try:
                failed, done = measure_group(args, console, repeat, group, by_name[group.layout][group.mode],
                                             placements[group.layout], gpu, knobs, cgroup, variant, run_id,
                                             requests, num_requests, metadata, deadline, starts, term)
                failures, measured = failures + failed, measured + done
            except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
                console.print(f"[red]{name} failed:[/red] {exc}")
                traceback.print_exc()
                failures += 1
    metadata["measured_points"], metadata["left_points"] = measured, total - measured
    save_run(args.result_dir, run_id, metadata)
    if measured < total:
        console.print(f"[yellow]time budget reached: {total - measured} of {total} points left; the same "
                      f"command with --resume continues[/yellow]")
    return failures
