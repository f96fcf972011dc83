"""`blink bench interference`: request-rate sweeps per engine mode, isolated and next to CPU attackers,
repeated and interleaved.

Points are (layout, mode, attack condition, rate). `--repeats N` measures each N times; within each
repeat the server groups (layout, mode) and the points in each are shuffled (sweep_plan.py), so drift
hits all of them. Each repeat of each point is kept with its raw per-request latencies in the result
folder; the tables (median and min-max over repeats, bootstrap intervals) are regenerated after every point
and the plots with error bars when the run ends, and a later call (or `--merge-from` another folder) adds repeats.

Layouts: split (front end on --frontend-cpus, engine on --engine-cpus, attackers on the engine's cores or
--attack-cpus, client on the rest: the SmartNIC stand-in), exposed (the front end on the attacked cores),
shared (nothing pinned, attackers on all cores). `--matrix priority1` is issue 19's first matrix.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal

from rich.console import Console

from blink.bench.attackers import optional_cpu_list
from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.interference_report import write_report
from blink.bench.interference_targets import Placement, Target, placement, targets
from blink.bench.result_folder import load_points, merge_folder, new_run_id, point_key, save_run
from blink.bench.runner import requests_for_window
from blink.bench.sched_knobs import POLICIES, AttackCgroup, AttackerKnobs, cgroup_support
from blink.bench.serve import add_workload_arguments
from blink.bench.stop_signal import Terminated, TermSignal
from blink.bench.sweep_plan import (
    LIGHT_RATE,
    MATRICES,
    ORDERS,
    POINT_COST_S,
    SERVER_START_S,
    Group,
    Repeat,
    estimate_seconds,
    matrix_rates,
    plan,
    points,
)
from blink.bench.sweep_runner import run_plan


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p)
    p.add_argument("--result-dir", required=True, help="points/, runs/, results.md and plots go here")
    p.add_argument("--merge-from", default=None, metavar="DIR",
                   help="copy DIR's repeats into --result-dir, regenerate the report, measure nothing")
    p.add_argument("--matrix", choices=sorted(MATRICES), default=None,
                   help="a named matrix (sweep_plan.py); sets layouts, modes, attack kinds and levels, rates, "
                        "repeats (unless --repeats) and the workload flags")
    p.add_argument("--modes", default="device,host", help="blink engine modes to start, comma separated")
    p.add_argument("--mode-variant", action="append", default=[], metavar="NAME=ENGINE:FLAGS",
                   help="also measure ENGINE (device or host) served with more `blink serve` FLAGS, reported as mode "
                        "NAME (e.g. 'device-paced=device:--decode-pace-ms 12'); its ratios against host mode are "
                        "reported beside device mode's")
    p.add_argument("--extra-base-url", action="append", default=[], metavar="NAME=URL",
                   help="also measure a server already running at URL, reported as mode NAME")
    p.add_argument("--extra-engine-pid", action="append", default=[], metavar="NAME=PID",
                   help="the pid whose CPU time is charged to extra mode NAME")
    p.add_argument("--layouts", default=None, help="comma separated: split, exposed, shared (default: "
                   "split if --engine-cpus is given, else shared)")
    p.add_argument("--request-rates", default="1,2,4,8", help="req/s, comma separated")
    p.add_argument("--light-rate", type=float, default=LIGHT_RATE, help="--matrix: the light rate")
    p.add_argument("--saturation-rate", type=float, default=None,
                   help="--matrix: the rate near saturation (default: the matrix's estimate, sweep_plan.py)")
    p.add_argument("--attack-kinds", default="spin", help="comma separated: spin, memory, compile, tokenize")
    p.add_argument("--attack-levels", default="0,1,2",
                   help="attack processes per attacked core, comma separated; 0 = isolated")
    p.add_argument("--repeats", type=int, default=None,
                   help="measure every point this many times (default: the matrix's, else 1)")
    p.add_argument("--first-repeat", type=int, default=0,
                   help="number the repeats from here (a later run adding repeats to a folder)")
    p.add_argument("--resume", action="store_true",
                   help="skip the (point, repeat) pairs already in --result-dir: the same command again "
                        "continues a plan cut by --time-budget-s")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no server or point that the estimate says would end after this many "
                        "seconds, counted from the first server start (the device tool's 10-minute "
                        "command limit); --resume continues")
    p.add_argument("--order", choices=ORDERS, default="shuffle", help="order of the points in a repeat")
    p.add_argument("--plan-seed", type=int, default=0, help="seed of the shuffle")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimate, measure nothing")
    p.add_argument("--point-cost-s", type=float, default=POINT_COST_S, help="estimate: seconds per point")
    p.add_argument("--server-start-s", type=float, default=SERVER_START_S,
                   help="estimate: seconds per server start")
    p.add_argument("--point-seconds", type=float, default=60.0, help="sending window of each point")
    p.add_argument("--drain-seconds", type=float, default=15.0, help="then wait this long for stragglers")
    p.add_argument("--attack-settle-seconds", type=float, default=2.0)
    p.add_argument("--warmup-requests", type=int, default=8, help="sent after each server start")
    p.add_argument("--idle-power-seconds", type=float, default=5.0,
                   help="GPU power is sampled this long before the sweep and after each server start")
    p.add_argument("--attack-cpus", default=None,
                   help="the CPUs the attackers run on in split and exposed (default: --engine-cpus)")
    p.add_argument("--client-cpus", default=None,
                   help="cores of this load generator in split and exposed (default: the cores left over)")
    p.add_argument("--gpu-index", type=int, default=None, help="NVML index (default: first visible GPU)")
    p.add_argument("--require-gpu", default=None, metavar="NAME",
                   help="measure only on a card whose NVML name holds NAME (e.g. H200): a folder's repeats must "
                        "come from one kind of card, and the lender may hand out another")
    knobs = p.add_argument_group("attacker scheduling (recorded in every point)")
    knobs.add_argument("--attacker-nice", type=int, default=None, help="niceness added to each attacker")
    knobs.add_argument("--attacker-sched", choices=sorted(POLICIES), default=None, help="SCHED_BATCH/IDLE")
    knobs.add_argument("--attacker-cpu-weight", type=int, default=None,
                       help="put the attackers in a cgroup of this cpu.weight (v2; v1 cpu.shares scaled)")
    knobs.add_argument("--frontend-reserved-cpus", default=None,
                       help="pin the front end here and keep every attacker off these cores")
    knobs.add_argument("--frontend-nice", type=int, default=None,
                       help="start blink serve's front end at this niceness (`blink serve --frontend-nice`)")
    serve = p.add_argument_group("blink serve")
    serve.add_argument("--dtype", default=None)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--frontend-cpus", default=None)
    serve.add_argument("--engine-cpus", default=None)
    serve.add_argument("--serve-args", default="", help="more `blink serve` flags, one shell-quoted string")
    serve.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /health")


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def apply_matrix(args: argparse.Namespace) -> None:
    """A named matrix overrides the sweep flags it names."""
    if not args.matrix:
        return
    m = MATRICES[args.matrix]
    args.layouts, args.modes, args.attack_kinds = m["layouts"], m["modes"], m["attack_kinds"]
    args.attack_levels = m["attack_levels"]
    for key, value in m["workload"].items():
        setattr(args, key, value)
    if args.repeats is None:
        args.repeats = m["repeats"]
    args.request_rates = ",".join(f"{r:g}" for r in matrix_rates(args.matrix, args.light_rate,
                                                                  args.saturation_rate))


def variant_of(knobs: AttackerKnobs, reserved: list[int] | None, frontend_nice: int | None = None,
               serve_args: str = "") -> str:
    """A short tag of the non-default knobs, part of a point's identity (a knob is a condition). Extra
    `blink serve` flags are one too: a point served with other flags must not merge with the plain one."""
    parts = [f"nice{knobs.nice}"] if knobs.nice else []
    parts += [knobs.policy] if knobs.policy else []
    parts += [f"w{knobs.cpu_weight}"] if knobs.cpu_weight else []
    parts += ["fe" + ",".join(map(str, reserved))] if reserved else []
    parts += [f"fenice{frontend_nice}"] if frontend_nice is not None else []
    flags = " ".join(word.removeprefix("--") for word in shlex.split(serve_args))
    parts += ["serve_" + re.sub(r"[^A-Za-z0-9.,=+-]+", "_", flags)] if flags else []
    return "-".join(parts)


def without_done(repeats: list[Repeat], result_dir: str, variant: str) -> list[Repeat]:
    """The plan less the (point, repeat) pairs the folder already holds (--resume)."""
    done = {(point_key(p), p["repeat"]) for p in load_points(result_dir)}
    left = []
    for r in repeats:
        groups = []
        for g in r.groups:
            todo = tuple(p for p in g.points if ((g.mode, g.layout, p.attack_kind, p.attack_level, variant,
                                                  p.rate), r.index) not in done)
            if todo:
                groups.append(Group(g.layout, g.mode, todo))
        if groups:
            left.append(Repeat(r.index, tuple(groups)))
    return left


def run_sweeps(args: argparse.Namespace, console: Console, term: TermSignal) -> int:
    apply_matrix(args)
    all_cpus = sorted(os.sched_getaffinity(0))
    layouts = parse_names(args.layouts or ("split" if args.engine_cpus else "shared"))
    placements: dict[str, Placement] = {layout: placement(layout, args, all_cpus) for layout in layouts}
    rates = parse_floats(args.request_rates)
    if not rates or any(r <= 0 or r == float("inf") for r in rates):
        raise SystemExit("--request-rates must be finite and positive: each point lasts --point-seconds")
    knobs = AttackerKnobs(args.attacker_nice, args.attacker_sched, args.attacker_cpu_weight)
    by_name: dict[str, dict[str, Target]] = {layout: {t.name: t for t in targets(args, placements[layout])}
                                             for layout in layouts}
    modes = list(next(iter(by_name.values())))
    specs = points(layouts, modes, parse_names(args.attack_kinds), parse_floats(args.attack_levels), rates)
    variant = variant_of(knobs, optional_cpu_list(args.frontend_reserved_cpus), args.frontend_nice,
                         args.serve_args)
    repeats = plan(specs, args.repeats or 1, args.order, args.plan_seed, args.first_repeat)
    if args.resume:
        repeats = without_done(repeats, args.result_dir, variant)
    estimate = estimate_seconds(repeats, args.point_cost_s, args.server_start_s)
    n_points = sum(len(g.points) for r in repeats for g in r.groups)
    n_starts = sum(len(r.groups) for r in repeats)
    console.print(f"plan: {n_points} points to measure ({len(specs)} a repeat), {n_starts} server "
                  f"starts: about {estimate / 60:.1f} min at {args.point_cost_s:g} s a point and "
                  f"{args.server_start_s:g} s a start")
    if args.matrix:
        workload = ", ".join(f"{k}={v}" for k, v in MATRICES[args.matrix]["workload"].items())
        console.print(f"matrix {args.matrix}: rates {args.request_rates} req/s; workload {workload}")
    cgroup_where, cgroup_how = cgroup_support()
    console.print(f"cgroup cpu weight: {cgroup_how if cgroup_where else 'not available: ' + cgroup_how}")
    if args.dry_run:
        for r in repeats:
            for g in r.groups:
                console.print(f"repeat {r.index} {g.layout}/{g.mode}: " + ", ".join(
                    f"{p.attack_kind} x{p.attack_level:g} @ {p.rate:g}" for p in g.points))
        return 0
    gpu = GpuMonitor(args.gpu_index)
    if args.require_gpu and args.require_gpu.lower() not in (gpu.name or "").lower():
        gpu.close()
        raise SystemExit(f"blink bench interference: --require-gpu {args.require_gpu}: this card is "
                         f"{gpu.name or 'unknown (no NVML)'}; nothing measured")
    run_id = new_run_id()
    metadata = {"run_id": run_id, "args": {k: v for k, v in vars(args).items() if k != "handler"},
                "estimate_s": estimate, "knobs": knobs.as_dict(), "cgroup_support": cgroup_how,
                "plan": [{"repeat": r.index, "groups": [{"layout": g.layout, "mode": g.mode, "points": [
                    [p.attack_kind, p.attack_level, p.rate] for p in g.points]} for g in r.groups]}
                         for r in repeats],
                "placements": {k: v.as_dict() for k, v in placements.items()},
                "gpu": gpu.name, "gpu_idle_power_before_sweep": gpu.idle_power(args.idle_power_seconds)}
    save_run(args.result_dir, run_id, metadata)
    num_requests = max(requests_for_window(max(rates), args.point_seconds), args.warmup_requests)
    try:
        with contextlib.ExitStack() as stack:
            cgroup = None
            if knobs.cpu_weight is not None:
                cgroup = stack.enter_context(AttackCgroup(knobs.cpu_weight))
                metadata["cgroup"] = cgroup.metadata()
                save_run(args.result_dir, run_id, metadata)
            return run_plan(args, console, repeats, by_name, placements, gpu, knobs,
                            cgroup.path if cgroup else None, variant, run_id, num_requests, metadata, term)
    finally:
        gpu.close()


def run(args: argparse.Namespace) -> int:
    os.makedirs(args.result_dir, exist_ok=True)
    console = Console()
    if args.merge_from:
        counts = merge_folder(args.result_dir, args.merge_from)
        write_report(args.result_dir)
        console.print(f"merged {args.merge_from}: {counts['copied']} files copied, {counts['skipped']} "
                      f"already there; results: {os.path.join(args.result_dir, 'results.md')}")
        return 0
    try:
        with TermSignal() as term:  # SIGTERM (`timeout`): servers and attackers are torn down, points kept
            failures = run_sweeps(args, console, term)
    except Terminated:
        console.print("[yellow]stopped by SIGTERM: the points measured so far are kept; the same command with "
                      "--resume continues[/yellow]")
        failures = None
    finally:
        if load_points(args.result_dir):
            write_report(args.result_dir)  # the tables again and the plots, over every point in the folder
    console.print(f"results: {os.path.join(args.result_dir, 'results.md')}")
    return 128 + signal.SIGTERM if failures is None else 1 if failures else 0

