"""Builds the engine the arguments ask for: host or device mode, with its tensor-parallel ranks if any.

The one place where the modes meet tensor parallelism: the engines take the ranks (or rank 0's TP runner)
ready-made, so neither mode imports blink.parallel.
"""
from __future__ import annotations

from blink.config import EngineArgs
from blink.core.interface import Engine


def make_engine(args: EngineArgs, loaded=None) -> Engine:
    """loaded: a preloaded LoadedModel (not allowed under tensor parallelism, which loads one shard a rank)."""
    if loaded is not None and args.tensor_parallel_size > 1:
        raise ValueError("a preloaded model cannot be used with tensor parallelism")
    if args.resolved_engine == "device":
        if args.resolved_device != "cuda":
            raise ValueError("--engine device needs a CUDA GPU; use --engine host on the CPU")
        from blink.device.engine import DeviceEngine

        return DeviceEngine(args, loaded, tp=start_device_ranks(args))
    from blink.host.engine import HostEngine

    if args.tensor_parallel_size > 1:
        from blink.parallel.host_tp import start_tensor_parallel

        return HostEngine(args, *start_tensor_parallel(args))
    return HostEngine(args, loaded)


def start_device_ranks(args: EngineArgs):
    """Device mode: rank 0's DeviceTensorParallel (ranks 1..N-1 started, this rank's shard loaded), or None."""
    if args.tensor_parallel_size == 1:
        return None
    from blink.parallel.device_tp import DeviceTensorParallel

    return DeviceTensorParallel(args)
