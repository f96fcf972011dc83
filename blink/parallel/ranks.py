"""Rank processes for tensor parallelism, either mode: rank 0 starts ranks 1..N-1 (spawned workers,
blink/parallel/worker.py, dying with it), joins their group, loads its own shard, and hears of their failures.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os

from blink.config import EngineArgs
from blink.parallel.group import (
    allow_device_launched_nccl,
    check_all_reduce,
    connect,
    disable_nvlink_multicast,
    make_store,
)
from blink.parallel.pinning import parse_rank_cpus
from blink.parallel.worker import worker_main
from blink.util.cpus import pin_process

READY_POLL_S = 0.2
JOIN_TIMEOUT_S = 10.0  # for workers to exit after the stop message
DEATH_GRACE_S = 2.0  # for a failing worker to report and exit after a collective failed


class TensorParallelError(RuntimeError):
    """A worker rank failed; the message names the rank and its error in one line."""


class Workers:
    """The spawned ranks 1..N-1 and the pipes they report through."""

    def __init__(self, args: EngineArgs, size: int, port: int):
        ctx = multiprocessing.get_context("spawn")
        self.processes, self.conns = [], []
        for rank in range(1, size):
            ours, theirs = ctx.Pipe(duplex=False)
            p = ctx.Process(target=worker_main, args=(rank, size, port, args, os.getpid(), theirs),
                            name=f"blink-tp-rank{rank}", daemon=True)
            p.start()
            theirs.close()
            self.processes.append(p)
            self.conns.append(ours)

    def wait_ready(self) -> None:
        waiting = set(range(len(self.processes)))
        while waiting:
            for i in list(waiting):
                if self.conns[i].poll(READY_POLL_S):
                    try:
                        kind, message = self.conns[i].recv()
                    except EOFError:  # it died without a word
                        self.processes[i].join(DEATH_GRACE_S)
                        kind, message = "error", f"exited with code {self.processes[i].exitcode}"
                    if kind == "error":
                        raise TensorParallelError(f"tensor-parallel rank {i + 1} failed: {message}")
                    waiting.discard(i)
                elif not self.processes[i].is_alive():
                    raise self.failure() or TensorParallelError(f"tensor-parallel rank {i + 1} exited")

    def dead(self) -> TensorParallelError | None:
        """Without waiting: a worker process that has ended, as an error (None while all run)."""
        for i, p in enumerate(self.processes):
            if p.exitcode is not None:
                return TensorParallelError(f"tensor-parallel rank {i + 1} died (exit code {p.exitcode})")
        return None

    def failure(self) -> TensorParallelError | None:
        """What went wrong on the workers, if anything (called after a collective or the set-up failed)."""
        # A crashing worker needs a moment to exit; a sentinel is ready once its process has ended.
        ended = set(multiprocessing.connection.wait([p.sentinel for p in self.processes], DEATH_GRACE_S))
        for i, (p, conn) in enumerate(zip(self.processes, self.conns, strict=True)):
            if p.sentinel in ended:
                p.join(DEATH_GRACE_S)  # reap it, so that its exit code is known
            with contextlib.suppress(EOFError, OSError):
                if conn.poll(0):
                    kind, message = conn.recv()
                    if kind == "error":
                        return TensorParallelError(f"tensor-parallel rank {i + 1} failed: {message}")
            if p.exitcode is not None:
                return TensorParallelError(f"tensor-parallel rank {i + 1} died (exit code {p.exitcode})")
        return None

    def kill(self) -> None:
        """After a failure: the others may be blocked in a collective that will never complete."""
        for p in self.processes:
            if p.is_alive():
                p.kill()
        self.close()

    def close(self) -> None:
        for p in self.processes:
            p.join(timeout=JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()


def launch_ranks(args: EngineArgs):
    """Start ranks 1..N-1 (host or device mode, as args say), join the group, load rank 0's shard; returns
    (LoadedModel, TPGroup, Workers, store). The workers report ready later (Workers.wait_ready)."""
    from blink.core.loaded_model import LoadedModel
    from blink.model import presets
    from blink.model.llama import check_tp_size

    size = args.tensor_parallel_size
    check_tp_size(presets.config_for(args.model), size)  # refuse before starting anything
    check_all_reduce(args.all_reduce, args.resolved_device)
    rank_cpus = parse_rank_cpus(args.rank_cpus, size)
    if args.resolved_device == "cuda":
        import torch

        if torch.cuda.device_count() < size:
            raise ValueError(f"--tensor-parallel-size {size} needs {size} GPUs; "
                             f"{torch.cuda.device_count()} are visible")
    disable_nvlink_multicast()
    allow_device_launched_nccl()
    if rank_cpus:
        pin_process(rank_cpus[0])  # this process is rank 0; the workers pin themselves at start
    store = make_store(0, size, 0)
    workers = Workers(args, size, store.port)
    try:
        group = connect(store, 0, size, args.resolved_device, args.all_reduce)
        loaded = LoadedModel.load(args, tp=group)
    except Exception as e:
        raise_worker_failure(workers, e)
    return loaded, group, workers, store


def raise_worker_failure(workers: Workers, error: Exception):
    """After rank 0 failed during set-up: kill the workers and raise what went wrong, theirs first."""
    failure = None if isinstance(error, TensorParallelError) else workers.failure()
    workers.kill()
    if failure is None:
        raise error
    raise failure from error


