"""Builds the engine the arguments ask for (host or device mode)."""
from __future__ import annotations

from blink.config import EngineArgs
from blink.engine.interface import Engine


def make_engine(args: EngineArgs) -> Engine:
    if args.resolved_engine == "device":
        if args.resolved_device != "cuda":
            raise ValueError("--engine device needs a CUDA GPU; use --engine host on the CPU")
        from blink.control.device_engine import DeviceEngine

        return DeviceEngine(args)
    from blink.engine.host_engine import HostEngine

    return HostEngine(args)
