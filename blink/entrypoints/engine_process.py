"""The engine process of `blink serve`: attach the front end's shared memory and serve its rings.

Usage: python -m blink.entrypoints.engine_process --shm NAME [engine args]
"""
from __future__ import annotations

import argparse
import signal
import sys

from blink.config import EngineArgs
from blink.util.gc_pauses import freeze_heap
from blink.util.processes import die_with_parent


def run_engine_process(argv: list[str] | None, prog: str, serve) -> int:
    """The shell of an engine process: parse `--shm NAME [engine args]`, die with the server, stop on
    SIGTERM/SIGINT, attach the segment, run serve(segment, args, should_stop), report a failure in one
    line (exit 2) and always mark the segment exited. blink.bench.null_engine uses it too."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--shm", required=True, help="name of the shared-memory segment")
    EngineArgs.add_cli_args(p)
    ns = p.parse_args(argv)
    args = EngineArgs.from_cli(ns)
    die_with_parent(sig=signal.SIGTERM)  # no orphan engine if the server is killed outright
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    from blink.transport.shm import Segment

    segment = Segment.attach(ns.shm)
    try:
        serve(segment, args, lambda: stop["flag"])
    except (ValueError, OSError, RuntimeError) as e:
        segment.control.error_code = 1
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    finally:
        segment.control.exited = 1
        segment.close()
    return 0


def serve_engine(segment, args: EngineArgs, should_stop) -> None:
    from blink.entrypoints.engine_factory import make_engine, start_device_ranks

    if args.resolved_engine == "device":
        from blink.device.engine import serve_device

        serve_device(segment, args, tp=start_device_ranks(args), should_stop=should_stop)
        return
    from blink.host.ring_loop import serve_rings

    engine = make_engine(args)
    if args.gc_freeze:  # host mode's per-step loop is Python: a full collection would stall the step
        freeze_heap()
    try:
        serve_rings(engine, segment, should_stop=should_stop)
    finally:
        engine.shutdown()  # stops tensor-parallel workers, if any


def main(argv: list[str] | None = None) -> int:
    return run_engine_process(argv, "blink engine", serve_engine)


if __name__ == "__main__":
    raise SystemExit(main())
