"""Host-mode tensor parallelism on rank 0 (the engine process, or the in-process LLM).

Rank 0 starts ranks 1..N-1 as spawned worker processes (blink/parallel/worker.py), loads its own shard,
and then, each step, broadcasts the step's inputs (step_message.py), fills its own StepBuffers and runs
the same bucket as every other rank; the all-reduces inside the forward keep the ranks in lockstep and
the all-gathered logits make every rank sample the same tokens, so only rank 0 reads them back.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
import weakref
from collections.abc import Callable

from blink.config import EngineArgs
from blink.core.outputs import SchedulerOutput
from blink.core.runner import ModelRunner
from blink.parallel.group import TPGroup
from blink.parallel.ranks import JOIN_TIMEOUT_S, TensorParallelError, Workers, launch_ranks, raise_worker_failure
from blink.parallel.step_message import Admission, encode_step, encode_stop
from blink.parallel.step_queue import StepQueue
from blink.parallel.worker import STEP_QUEUE_KEY

STEP_PUT_TIMEOUT_S = 300.0  # a worker that takes no step for this long is stuck
LIVENESS_CHECK_S = 0.05  # while rank 0 waits for a step on the GPU, how often it looks for dead workers
_queue_ids = itertools.count()


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

    def execute(self, plan: SchedulerOutput):
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
            runner.run(bucket, runner.needs_search(plan))  # the workers replay theirs with it: the sampler has no
            # collective, and they capture the searchless graphs only to keep the captures' collectives in step
            if self.step_done is not None:  # a dead worker would leave the step inside a collective forever
                self.step_done.record()
                wait_or_fail(self.step_done.query, self.workers.dead)
            return runner.read_back(plan)
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


def start_tensor_parallel(args: EngineArgs):
    """Host mode: start the ranks; returns (LoadedModel, TensorParallelRunner)."""
    loaded, group, workers, store = launch_ranks(args)
    queue = StepQueue.create(f"blink-tp-{os.getpid()}-{next(_queue_ids)}", readers=args.tensor_parallel_size - 1)
    try:
        store.set(STEP_QUEUE_KEY, queue.name)
        runner = ModelRunner.for_model(loaded, use_graphs=loaded.device == "cuda" and not args.enforce_eager)
        workers.wait_ready()  # every worker has attached the queue: its file may go
        queue.unlink()
    except Exception as e:
        queue.close()
        raise_worker_failure(workers, e)
    return loaded, TensorParallelRunner(runner, group, workers, store, queue)
