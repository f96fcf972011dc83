"""Host-mode tensor parallelism on rank 0 (the engine process, or the in-process LLM).

Rank 0 starts ranks 1..N-1 as spawned worker processes (blink/parallel/worker.py), loads its own shard,
and then, each step, broadcasts the step's inputs (step_message.py), fills its own StepBuffers and runs
the same bucket as every other rank; the all-reduces inside the forward keep the ranks in lockstep and
the all-gathered logits make every rank sample the same tokens, so only rank 0 reads them back.
"""
from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from blink.config import EngineArgs
from blink.engine.scheduler import StepPlan
from blink.parallel.group import (
    TPGroup,
    allow_device_launched_nccl,
    check_all_reduce,
    connect,
    disable_nvlink_multicast,
    make_store,
)
from blink.parallel.pinning import parse_rank_cpus, pin_process
from blink.parallel.step_message import Admission, encode_step, encode_stop
from blink.parallel.step_queue import StepQueue
from blink.parallel.worker import STEP_QUEUE_KEY, build_runner, worker_main

READY_POLL_S = 0.2
JOIN_TIMEOUT_S = 10.0  # for workers to exit after the stop message
DEATH_GRACE_S = 2.0  # for a failing worker to report and exit after a collective failed
STEP_PUT_TIMEOUT_S = 300.0  # a worker that takes no step for this long is stuck
LIVENESS_CHECK_S = 0.05  # while rank 0 waits for a step on the GPU, how often it looks for dead workers
_queue_ids = itertools.count()


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


class TensorParallelRunner:
    """Rank 0's runner: ModelRunner.execute's contract, with every step mirrored on the worker ranks."""

    def __init__(self, runner, group: TPGroup, workers: Workers, store, queue: StepQueue):
        self.runner, self.group, self.workers, self.queue = runner, group, workers, queue
        self.store = store  # the rendezvous store must outlive the group
        self.step_done = None
        if runner.device.type == "cuda":
            import torch

            self.step_done = torch.cuda.Event()
        # Stops the workers even if nobody calls shutdown() (an LLM that is simply dropped).
        self._stop_workers = weakref.finalize(self, _stop_workers, queue, workers)

    def execute(self, plan: StepPlan, want_top: int = 0):
        if not self._stop_workers.alive:
            raise TensorParallelError("the tensor-parallel workers are shut down")
        runner = self.runner
        bucket = runner.bucket_of(plan)
        inputs = runner.step_inputs(plan, bucket)
        admissions = [Admission(s.slot, s.params, s.seed, list(s.prompt_ids), list(s.output_ids))
                      for s in plan.admitted]
        try:
            self.queue.put(encode_step(bucket, inputs, admissions), timeout=STEP_PUT_TIMEOUT_S,
                           failure=self.workers.dead)
            runner.fill(runner.buffers, inputs)
            runner.run(bucket)
            if self.step_done is not None:  # a dead worker would leave the step inside a collective forever
                self.step_done.record()
                wait_or_fail(self.step_done.query, self.workers.dead)
            return runner.read_back(plan, want_top)
        except Exception as e:
            self._stop_workers.detach()
            failure = self.workers.failure()
            self.workers.kill()
            self.queue.close()
            if failure is None:
                raise  # rank 0's own error
            raise failure from e

    def shutdown(self) -> None:
        self._stop_workers()


def wait_or_fail(done: Callable[[], bool], failure: Callable[[], Exception | None],
                 every_s: float = LIVENESS_CHECK_S) -> None:
    """Spin until done() (as a blocking read-back spins on the GPU), calling failure() every every_s seconds
    and raising what it returns."""
    next_check = time.monotonic() + every_s
    while not done():
        if time.monotonic() >= next_check:
            error = failure()
            if error is not None:
                raise error
            next_check = time.monotonic() + every_s


def _stop_workers(queue: StepQueue, workers: Workers) -> None:
    with contextlib.suppress(Exception):  # a dead worker cannot hear it: close() reaps it anyway
        queue.put(encode_stop(), timeout=JOIN_TIMEOUT_S)
    workers.close()
    queue.close()


def _model_config(args: EngineArgs):
    from blink.model import presets
    from blink.model.config import ModelConfig
    from blink.model.demo import ensure_default_model

    source = args.model or str(ensure_default_model())
    return presets.get(source) if source in presets.PRESETS else ModelConfig.from_dir(Path(source))


def launch_ranks(args: EngineArgs):
    """Start ranks 1..N-1 (host or device mode, as args say), join the group, load rank 0's shard; returns
    (LoadedModel, TPGroup, Workers, store). The workers report ready later (Workers.wait_ready)."""
    from blink.engine.loaded_model import LoadedModel
    from blink.model.llama import check_tp_size

    size = args.tensor_parallel_size
    check_tp_size(_model_config(args), size)  # refuse before starting anything
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


def start_tensor_parallel(args: EngineArgs):
    """Host mode: start the ranks; returns (LoadedModel, TensorParallelRunner)."""
    loaded, group, workers, store = launch_ranks(args)
    queue = StepQueue.create(f"blink-tp-{os.getpid()}-{next(_queue_ids)}", readers=args.tensor_parallel_size - 1)
    try:
        store.set(STEP_QUEUE_KEY, queue.name)
        runner = build_runner(loaded, args)
        workers.wait_ready()  # every worker has attached the queue: its file may go
        queue.unlink()
    except Exception as e:
        queue.close()
        raise_worker_failure(workers, e)
    return loaded, TensorParallelRunner(runner, group, workers, store, queue)
