"""Where everything runs in each layout of the interference lab, and the servers under test.

- split: front end on --frontend-cpus, engine on --engine-cpus, attackers on --attack-cpus (default: the
  engine's), the client on the cores left over. The front end's own cores stand in for a SmartNIC.
- exposed: as split, but the front end is pinned to the attacked cores (the conventional colocation the
  issue measured: front end and engine on the attacked cores, the client apart).
- shared: nothing pinned, attackers on every core, the client unpinned.
--frontend-reserved-cpus, in any layout, pins the front end to those cores and keeps attackers off them.
"""
from __future__ import annotations

import argparse
import asyncio
import re
import shlex
from dataclasses import dataclass

import httpx

from blink.bench.attackers import optional_cpu_list
from blink.bench.runner import fetch_model_name
from blink.bench.server_process import ServeSpec
from blink.util.cpus import format_cpu_list

LAYOUTS = ("split", "exposed", "shared")


@dataclass(frozen=True)
class Placement:
    layout: str
    frontend_cpus: list[int] | None  # None: not pinned
    engine_cpus: list[int] | None
    attack_cpus: list[int]
    client_cpus: list[int] | None

    def as_dict(self) -> dict:
        return {k: format_cpu_list(v) if isinstance(v, list) else v for k, v in vars(self).items()}


def placement(layout: str, args: argparse.Namespace, all_cpus: list[int]) -> Placement:
    if layout not in LAYOUTS:
        raise SystemExit(f"unknown layout {layout!r}; one of {LAYOUTS}")
    reserved = optional_cpu_list(args.frontend_reserved_cpus)
    if layout == "shared":
        frontend, engine, attack, client = None, None, list(all_cpus), None
    else:
        engine = optional_cpu_list(args.engine_cpus)
        if not engine:
            raise SystemExit(f"the {layout} layout needs --engine-cpus")
        attack = optional_cpu_list(args.attack_cpus) or engine
        frontend = optional_cpu_list(args.frontend_cpus) if layout == "split" else list(attack)
        busy = set(engine) | set(attack) | set(frontend or []) | set(reserved or [])
        client = optional_cpu_list(args.client_cpus) or [c for c in all_cpus if c not in busy] or None
    if reserved:
        frontend = reserved
        attack = [c for c in attack if c not in reserved]
        if client:
            client = [c for c in client if c not in reserved] or None
        if not attack:
            raise SystemExit("--frontend-reserved-cpus leaves no core for the attackers")
    return Placement(layout, frontend, engine, attack, client)


@dataclass(frozen=True)
class Target:
    """A server under test: a blink engine mode started here (`serve`), or an external `base_url`."""

    name: str
    serve: ServeSpec | None = None
    base_url: str | None = None
    engine_pid: int | None = None


def parse_named(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def frontend_nice_args(args: argparse.Namespace) -> tuple[str, ...]:
    nice = args.frontend_nice
    return () if nice is None else ("--frontend-nice", str(nice))


ENGINES = ("device", "host")


def mode_variants(items: list[str], modes: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """`--mode-variant NAME=ENGINE:FLAGS`: (name, engine, its own `blink serve` flags), measured as a mode of its own
    (e.g. `device-paced=device:--decode-pace-ms 12` beside plain device and host)."""
    found = []
    for item in items:
        name, sep, rest = item.partition("=")
        engine, colon, flags = rest.partition(":")
        name, engine = name.strip(), engine.strip()
        if not sep or not colon or not name or engine not in ENGINES or not re.fullmatch(r"[A-Za-z0-9.+-]+", name):
            raise SystemExit(f"--mode-variant {item!r}: expected NAME=ENGINE:FLAGS, NAME of letters, digits, '.', "
                             f"'+' or '-', ENGINE one of {', '.join(ENGINES)}")
        if name in modes or name in [f[0] for f in found]:
            raise SystemExit(f"--mode-variant {item!r}: mode {name!r} is measured already")
        found.append((name, engine, tuple(shlex.split(flags))))
    return found


def targets(args: argparse.Namespace, where: Placement) -> list[Target]:
    found = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    named = [(m, m, ()) for m in modes] + mode_variants(args.mode_variant, modes)
    for name, engine, own_flags in named:
        spec = ServeSpec(
            engine=engine, model=args.model, tokenizer=args.tokenizer, dtype=args.dtype,
            max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=args.enforce_eager,
            host=args.host, port=args.port, frontend_cpus=format_cpu_list(where.frontend_cpus) or None,
            engine_cpus=format_cpu_list(where.engine_cpus) or None,
            extra_args=tuple(shlex.split(args.serve_args)) + frontend_nice_args(args) + own_flags)
        found.append(Target(name=name, serve=spec))
    pids = parse_named(args.extra_engine_pid)
    for name, url in parse_named(args.extra_base_url).items():
        found.append(Target(name=name, base_url=url, engine_pid=int(pids[name]) if name in pids else None))
    return found


def served_model_name(base_url: str, fallback: str | None) -> str:
    """The name to put in requests: what the server lists (an external peer may serve --model under
    another name), else --model."""
    try:
        return asyncio.run(fetch_model_name(base_url))
    except (httpx.HTTPError, KeyError, IndexError):
        if fallback is None:
            raise
        return fallback
