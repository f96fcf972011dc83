"""The `blink bench ...` subcommands; each stores its handler (args -> exit code) as `args.handler`.

serve, attack, interference, barrier and allreduce expose `add_arguments(parser)` and `run(args)`; step and
offline (optional modules) expose `add_parser(subparsers)`, which registers themselves.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = (
    ("serve", "blink.bench.serve", "load an OpenAI-compatible server (vLLM `bench serve` flags)"),
    ("attack", "blink.bench.attackers", "CPU interference on chosen cores for a fixed time"),
    ("interference", "blink.bench.interference", "rate sweeps per engine mode, isolated and under attack"),
    ("barrier", "blink.bench.barrier", "tensor-parallel step times with one rank's cores attacked, or all"),
    ("allreduce", "blink.bench.allreduce", "NCCL vs peer-to-peer all-reduce latency across the GPUs"),
)
OPTIONAL_MODULES = ("blink.bench.step", "blink.bench.offline")
BENCH_EXTRA = "pip install 'blink[bench]'"  # the benchmark-only packages (plots, NVML, HTTP client, ...)


def _needs_extra(subparsers, name: str, help_text: str, missing: str) -> None:
    """A subcommand whose packages are not installed: it says so in one line (exit 2) instead of `blink`
    failing as a whole, so serve and generate work on the base install."""
    # No options of its own (any flag is taken as an argument), so every command line reaches the message.
    parser = subparsers.add_parser(name, help=f"{help_text} [needs {BENCH_EXTRA}]", prefix_chars="\x00",
                                   add_help=False)
    parser.add_argument("args", nargs=argparse.REMAINDER)

    def handler(_args) -> int:
        print(f"blink bench {name}: error: needs the package {missing!r}: {BENCH_EXTRA}", file=sys.stderr)
        return 2

    parser.set_defaults(handler=handler)


def add_bench_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register the bench subcommands on the `blink bench` subparsers."""
    for name, module_name, help_text in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if (exc.name or "blink").split(".")[0] == "blink":  # our own code: a real bug
                raise
            _needs_extra(subparsers, name, help_text, exc.name)
            continue
        parser = subparsers.add_parser(name, help=help_text, description=module.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(parser)
        parser.set_defaults(handler=module.run)
    for module_name in OPTIONAL_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name or (exc.name or "blink").split(".")[0] != "blink":
                continue  # not shipped, or its benchmark packages are not installed
            raise
        module.add_parser(subparsers)


def main(argv: list[str] | None = None) -> int:
    """`python -m blink.bench ...`: the bench commands without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="blink bench")
    subparsers = parser.add_subparsers(dest="bench_command", required=True)
    add_bench_subcommands(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)
