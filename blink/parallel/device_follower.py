"""Device-mode tensor parallelism: the other ranks' half, and how rank 0 reaches them.

A follower rank (1..N-1) holds its weight shard, its KV heads and two StepBuffers sets carved from one
device arena that also holds its mailbox word. It captures the same bucket graphs as rank 0 (ending at
the all-gathered logits: only rank 0 samples), then runs the follower kernel (csrc/follower.cuh): no host
work per step. Rank 0 maps each follower's arena into its own address space (CUDA IPC, `export()` /
`PeerMapping.open`) and its scheduler writes the step inputs and the mailbox there over NVLink.
"""
from __future__ import annotations

import ctypes as C
import gc
import time

import torch

from blink.core.runner import ModelRunner
from blink.core.step_buffers import StepBuffers
from blink.device import structs
from blink.device.build import load_device_library
from blink.device.device_graphs import (
    CUDA_ERROR_NOT_READY,
    STEP_TIMEOUT_S,
    capture_device_graphs,
    cuda_check,
    destroy_execs,
    exec_table,
    struct_on_device,
)
from blink.kernels.sampling_grid import SEARCHLESS_DEFAULT
from blink.parallel.ipc import ipc_export

MAILBOX_BYTES = 256  # one 8-byte word, padded to the arena's alignment


def arena_layout(runner: ModelRunner) -> tuple[int, int]:
    """(bytes per StepBuffers set, total arena bytes: two sets, then the mailbox)."""
    per_set = StepBuffers.nbytes(runner.max_tokens, runner.max_seqs, runner.max_blocks_per_seq)
    return per_set, 2 * per_set + MAILBOX_BYTES


class FollowerLoop:
    def __init__(self, loaded, args):
        m = loaded
        self.lib = lib = load_device_library()
        self.device = torch.device(m.device)
        self.runner = runner = ModelRunner.for_model(m, use_graphs=False, samples=False)
        per_set, total = arena_layout(runner)
        self.arena = torch.zeros(total, dtype=torch.uint8, device=self.device)
        self.buffer_sets = [StepBuffers.allocate(runner.max_tokens, runner.max_seqs, runner.max_blocks_per_seq,
                                                 self.device, arena=self.arena[k * per_set:(k + 1) * per_set])
                            for k in (0, 1)]
        self.mailbox_offset = 2 * per_set
        self.state = torch.zeros(lib.blink_follower_state_bytes(), dtype=torch.uint8, device=self.device)
        self.stream, self.loop_exec = C.c_void_p(), C.c_void_p()
        self.graphs, self.execs = {}, []
        self.running = False
        cuda_check(lib, lib.blink_stream_create(C.byref(self.stream)), "cudaStreamCreate")
        try:
            done = lib.blink_follower_done_counter(self.state.data_ptr())
            # the searchless captures too, in step with rank 0's (they run collectives); a follower does not
            # sample, so it launches its first variant only
            table = capture_device_graphs(lib, runner, self.buffer_sets, self.stream, done, self.graphs, self.execs,
                                          searchless=SEARCHLESS_DEFAULT)
            self.exec_table = exec_table(table, self.device)
            params = structs.FollowerParams(
                mailbox=self.arena.data_ptr() + self.mailbox_offset, state=self.state.data_ptr(),
                graph_execs=self.exec_table.data_ptr(), num_buckets=len(runner.buckets),
                launches_per_kernel=structs.LAUNCHES_PER_KERNEL, step_timeout_ns=int(STEP_TIMEOUT_S * 1e9))
            self.params = struct_on_device(params, self.device)
            cuda_check(lib, lib.blink_follower_create(self.params.data_ptr(), self.stream, C.byref(self.loop_exec)),
                       "follower graph")
            torch.cuda.synchronize(self.device)
        except BaseException:
            self.close()
            raise

    def export(self) -> dict:
        """What rank 0 needs to map this rank's arena (picklable): the CUDA IPC handle of the cudaMalloc
        block holding it, the arena's offset in that block, and the fields' offsets in the arena."""
        handle, offset = ipc_export(self.arena)
        base = self.arena.data_ptr()
        offsets = [{name: ptr - base for name, ptr in buf.pointers().items()} for buf in self.buffer_sets]
        return {"handle": handle, "offset": offset, "buffers": offsets, "mailbox": self.mailbox_offset}

    def start(self) -> None:
        gc.collect()  # nothing may be freed (cudaFree synchronizes the device) once the loop is resident
        torch.cuda.synchronize(self.device)
        cuda_check(self.lib, self.lib.blink_loop_launch(self.loop_exec, self.stream), "launching the follower")
        self.running = True

    def wait(self, poll_s: float = 0.05) -> None:
        """Until the loop ends (rank 0 posted stop); raises if it ended on an error."""
        while self.lib.blink_stream_query(self.stream) == CUDA_ERROR_NOT_READY:
            time.sleep(poll_s)
        code = self.lib.blink_stream_synchronize(self.stream)
        self.running = False
        cuda_check(self.lib, code, "the follower loop")
        st = structs.FollowerState.from_buffer_copy(self.state.cpu().numpy().tobytes())
        if st.error_code:
            raise RuntimeError(f"the follower loop stopped after {st.launched} steps: "
                               f"{structs.describe_error(st.error_code)}")

    def close(self) -> None:
        if self.running:
            return  # still resident: freeing what it uses would fault; the process has to exit
        destroy_execs(self.lib, [*self.execs, self.loop_exec.value])
        self.execs, self.loop_exec = [], C.c_void_p()
        if self.stream:
            self.lib.blink_stream_destroy(self.stream)
            self.stream = C.c_void_p()
        self.graphs.clear()
