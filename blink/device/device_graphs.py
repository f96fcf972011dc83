"""The forward graphs of device mode, shared by rank 0's scheduler loop (runtime.py) and the other
tensor-parallel ranks' follower loops (follower.py): each bucket captured once per buffer set, in the same
order on every rank (the captures run collectives), ending with the step_done kernel that bumps the loop's
completion counter, then instantiated for launch from the device."""
from __future__ import annotations

import ctypes as C

import numpy as np
import torch

CUDA_ERROR_NOT_READY = 600  # cudaStreamQuery: work still running
STEP_TIMEOUT_S = 120.0  # a forward that never signals completion is an error, not a hang
NODE_TYPES = ("kernel", "memcpy", "memset", "host", "child graph", "empty", "wait event", "record event",
              "ext semaphore signal", "ext semaphore wait", "mem alloc", "mem free", "batch mem op",
              "conditional", "type14", "type15")


def cuda_check(lib, code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed: {lib.blink_cuda_error_string(code).decode()} ({code})")


def struct_on_device(struct: C.Structure, device) -> torch.Tensor:
    """A ctypes struct's bytes in device memory, for a kernel that takes a pointer to it."""
    return torch.from_numpy(np.frombuffer(bytes(struct), dtype=np.uint8).copy()).to(device)


def exec_table(table: list[int], device) -> torch.Tensor:
    """The execs as the device-side cudaGraphExec_t array the loop kernels index (csrc/sched_variant.h's
    graph_exec_index: [variant][bucket][parity])."""
    return torch.tensor(np.array(table, dtype=np.uint64).view(np.int64), device=device)


def destroy_execs(lib, execs: list[int]) -> None:
    for exec_ in execs:
        if exec_:
            lib.blink_exec_destroy(exec_)


def capture_device_graphs(lib, runner, buffer_sets, stream, done_counter: int, graphs: dict, execs: list,
                          searchless: bool = False) -> list[int]:
    """Fills graphs[(bucket index, parity, search)] (torch CUDAGraphs, kept alive by the caller) and execs (each
    device-launchable exec once) as it goes, so that the caller can free what exists if a later capture fails.
    searchless: each decode bucket also captured without the sampler's search (ModelRunner.capture's search).
    Returns the exec table's entries, [variant][bucket][parity]: variant 0 with the search, then (searchless)
    variant 1, where a bucket with no such graph repeats its variant-0 exec."""

    def step_done(stream_ptr: int) -> None:
        cuda_check(lib, lib.blink_capture_step_done(C.c_void_p(stream_ptr), C.c_void_p(done_counter)),
                   "capturing step_done")

    buckets = runner.buckets
    for b in reversed(range(len(buckets))):  # largest first: the rest reuse its pool
        for parity in (0, 1):
            graphs[b, parity, True] = runner.capture(buckets[b], buffer_sets[parity], step_done)
            if searchless and buckets[b][0] == buckets[b][1]:
                graphs[b, parity, False] = runner.capture(buckets[b], buffer_sets[parity], step_done, search=False)
    index = {}
    for key in sorted(graphs, key=lambda k: (not k[2], k[0], k[1])):
        exec_ = C.c_void_p()
        raw = C.c_void_p(graphs[key].raw_cuda_graph())
        code = lib.blink_instantiate_device(raw, stream, C.byref(exec_))
        if code != 0:
            counts = (C.c_int * 16)()
            lib.blink_describe_graph(raw, counts)
            kinds = {NODE_TYPES[i]: n for i, n in enumerate(counts) if n}
            cuda_check(lib, code, f"device-launch instantiation of bucket {buckets[key[0]]} (graph nodes: {kinds})")
        execs.append(exec_.value)
        index[key] = exec_.value
    return [index.get((b, parity, search), index[b, parity, True])
            for search in ((True, False) if searchless else (True,)) for b in range(len(buckets)) for parity in (0, 1)]
