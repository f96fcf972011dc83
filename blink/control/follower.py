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
from dataclasses import dataclass

import torch

from blink.control import structs
from blink.control.build import load_device_library
from blink.control.device_graphs import (
    CUDA_ERROR_NOT_READY,
    STEP_TIMEOUT_S,
    capture_device_graphs,
    cuda_check,
    destroy_execs,
    exec_table,
    struct_on_device,
)
from blink.engine.runner import ModelRunner
from blink.engine.step_buffers import StepBuffers

MAILBOX_BYTES = 256  # one 8-byte word, padded to the arena's alignment
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def arena_layout(runner: ModelRunner) -> tuple[int, int]:
    """(bytes per StepBuffers set, total arena bytes: two sets, then the mailbox)."""
    per_set = StepBuffers.nbytes(runner.max_tokens, runner.max_seqs, runner.max_blocks_per_seq)
    return per_set, 2 * per_set + MAILBOX_BYTES


class FollowerLoop:
    def __init__(self, loaded, args):
        m = loaded
        self.lib = lib = load_device_library()
        self.device = torch.device(m.device)
        self.runner = runner = ModelRunner(
            m.model, m.kv_cache, m.sampling_state, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=m.max_num_batched_tokens, max_model_len=m.max_model_len, device=m.device,
            use_graphs=False, samples=False)
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
            capture_device_graphs(lib, runner, self.buffer_sets, self.stream, done, self.graphs, self.execs)
            self.exec_table = exec_table(self.execs, self.device)
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


def ipc_export(arena: torch.Tensor) -> tuple[bytes, int]:
    """(the CUDA IPC handle of the cudaMalloc block holding `arena`, the arena's byte offset in it)."""
    _, handle, _, block_offset, *_ = arena.untyped_storage()._share_cuda_()
    return raw_ipc_handle(handle), block_offset + arena.storage_offset() * arena.element_size()


def ipc_open(lib, handle: bytes, offset: int, what: str = "cudaIpcOpenMemHandle") -> tuple[int, int]:
    """ipc_export's (handle, offset) from another process, mapped for the current device: (the mapped
    block, for blink_ipc_close; the arena's address here)."""
    block = C.c_void_p()
    cuda_check(lib, lib.blink_ipc_open(handle, C.byref(block)), what)
    return block.value, block.value + offset


def raw_ipc_handle(handle: bytes) -> bytes:
    """torch's storage handle is the 64-byte cudaIpcMemHandle_t, or (torch >= 2.5) that behind a version
    byte and a type byte ('c': a plain cudaMalloc block)."""
    if len(handle) == IPC_HANDLE_BYTES:
        return handle
    if len(handle) == IPC_HANDLE_BYTES + 2 and handle[1:2] == b"c":
        return handle[2:]
    raise RuntimeError(f"cannot share this arena: an unknown CUDA IPC handle format ({len(handle)} bytes)")


@dataclass
class PeerMapping:
    """A follower's arena as rank 0 sees it: its buffer sets' and mailbox's addresses in rank 0's process."""

    block: int  # the mapped cudaMalloc block (closed by close())
    buffers: list[dict[str, int]]
    mailbox: int

    @classmethod
    def open(cls, export: dict, lib) -> PeerMapping:
        """Map it for the current device (rank 0's), whose scheduler kernel stores into it over NVLink."""
        block, base = ipc_open(lib, export["handle"], export["offset"])
        return cls(block, [{name: base + off for name, off in offsets.items()}
                                 for offsets in export["buffers"]], base + export["mailbox"])

    def close(self, lib) -> None:
        if self.block:
            lib.blink_ipc_close(self.block)
            self.block = 0


def peer_table(peers: list[PeerMapping]) -> structs.PeerTable:
    if len(peers) > structs.MAX_PEERS:
        raise ValueError(f"device mode supports tensor parallelism up to {structs.MAX_PEERS + 1} ranks")
    table = structs.PeerTable(num_peers=len(peers))
    for j, peer in enumerate(peers):
        table.peers[j].mailbox = peer.mailbox
        for k in (0, 1):
            for name in structs.STEP_BUFFER_FIELDS:
                setattr(table.peers[j].buffers[k], name, peer.buffers[k][name])
    return table
