"""A tensor-parallel worker rank (1..N-1): loads its shard, then, in host mode, replays every step rank 0
broadcasts until rank 0 says stop; in device mode, runs its follower loop on the GPU (blink/device/
follower.py) until rank 0's scheduler posts stop. It dies with its parent (PR_SET_PDEATHSIG) and reports
any error to rank 0 as one line through its pipe before exiting."""
from __future__ import annotations

import os

import torch

from blink.config import EngineArgs
from blink.core.runner import ModelRunner
from blink.parallel.group import allow_device_launched_nccl, connect, disable_nvlink_multicast, make_store
from blink.parallel.pinning import parse_rank_cpus
from blink.parallel.step_message import decode_step
from blink.parallel.step_queue import StepQueue
from blink.util.cpus import pin_process
from blink.util.processes import die_with_parent


def worker_main(rank: int, size: int, port: int, args: EngineArgs, parent_pid: int, conn) -> None:
    """Entry point of a spawned worker process."""
    die_with_parent(parent_pid)
    disable_nvlink_multicast()
    allow_device_launched_nccl()
    device_mode = args.resolved_engine == "device"
    try:
        rank_cpus = parse_rank_cpus(args.rank_cpus, size, check_available=False)
        if rank_cpus:
            pin_process(rank_cpus[rank])  # before torch starts its thread pools
        if args.resolved_device == "cpu":
            torch.set_num_threads(1)  # rank 0 keeps the other cores
        from blink.core.loaded_model import LoadedModel

        store = make_store(rank, size, port)
        group = connect(store, rank, size, args.resolved_device, args.all_reduce)
        loaded = LoadedModel.load(args, tp=group)
        if device_mode:
            follow(store, rank, loaded, args, conn)
            return
        runner = ModelRunner.for_model(loaded, use_graphs=loaded.device == "cuda" and not args.enforce_eager)
        queue = StepQueue.attach(store.get(STEP_QUEUE_KEY).decode(), reader=rank - 1)
        conn.send(("ready", ""))
        serve_steps(queue, runner, loaded.sampling_state)
    except BaseException as e:  # noqa: BLE001 - whatever it is, rank 0 must hear of it
        message = " ".join(f"{type(e).__name__}: {e}".split())
        try:
            conn.send(("error", message))
        finally:
            os._exit(1)


def serve_steps(queue: StepQueue, runner, sampling_state) -> None:
    while (step := decode_step(queue.get(), runner.max_blocks_per_seq)) is not None:
        bucket, inputs, admissions = step
        for a in admissions:
            sampling_state.set_slot(a.slot, a.params, a.seed, a.prompt_ids, a.output_ids)
        runner.fill(runner.buffers, inputs)
        runner.run(bucket)


def follow(store, rank: int, loaded, args: EngineArgs, conn) -> None:
    """Device mode: capture in lockstep with rank 0, publish this rank's arena, run until stop."""
    import pickle

    from blink.parallel.device_follower import FollowerLoop

    loop = FollowerLoop(loaded, args)
    store.set(follower_key(rank), pickle.dumps(loop.export()))
    conn.send(("ready", ""))
    loop.start()
    loop.wait()
    loop.close()


STEP_QUEUE_KEY = "blink/step_queue"  # the store entry naming host mode's step queue


def follower_key(rank: int) -> str:
    return f"blink/follower/{rank}"
