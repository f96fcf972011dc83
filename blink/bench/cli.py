"""The `blink bench ...` subcommands; each stores its handler (args -> exit code) as `args.handler`.

serve, attack, interference, barrier and allreduce expose `add_arguments(parser)` and `run(args)`; step and
offline (optional modules) expose `add_parser(subparsers)`, which registers themselves.
"""
from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = (
    ("serve", "blink.bench.serve", "load an OpenAI-compatible server (vLLM `bench serve` flags)"),
    ("attack", "blink.bench.attackers", "CPU interference on chosen cores for a fixed time"),
    ("interference", "blink.bench.interference", "rate sweeps per engine mode, isolated and under attack"),
    ("barrier", "blink.bench.barrier", "tensor-parallel step times with one rank's cores attacked, or all"),
    ("allreduce", "blink.bench.allreduce", "NCCL vs peer-to-peer all-reduce latency across the GPUs"),
)
OPTIONAL_MODULES = ("blink.bench.step", "blink.bench.offline")


def add_bench_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register the bench subcommands on the `blink bench` subparsers."""
    for name, module_name, help_text in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        parser = subparsers.add_parser(name, help=help_text, description=module.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(parser)
        parser.set_defaults(handler=module.run)
    for module_name in OPTIONAL_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # the module exists but something it imports is missing
                raise
            continue
        module.add_parser(subparsers)


def main(argv: list[str] | None = None) -> int:
    """`python -m blink.bench ...`: the bench commands without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="blink bench")
    subparsers = parser.add_subparsers(dest="bench_command", required=True)
    add_bench_subcommands(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)
