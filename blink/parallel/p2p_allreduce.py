"""A one-shot peer-to-peer all-reduce for decode-sized bf16 tensors (csrc/p2p_allreduce.cu), the
alternative to NCCL inside the forward graphs (issue 7 asks to measure both; blink/bench/allreduce.py
does). Each rank allocates one arena (two parities of `world` staging slots, the flags, its epochs),
publishes its CUDA IPC handle on the rendezvous store and maps every peer's arena for its own device.
A call is one kernel on the caller's stream, so it can be captured in a graph and launched from the GPU.
"""
from __future__ import annotations

import ctypes as C
import pickle

import numpy as np
import torch

from blink.control.build import load_device_library
from blink.control.device_graphs import cuda_check
from blink.control.follower import raw_ipc_handle

MAX_WORLD = 8  # csrc/p2p_allreduce.cu kMaxWorld
MAX_BLOCKS = 64


class P2PAllReduceParams(C.Structure):  # csrc/p2p_allreduce.cu
    _fields_ = [("world", C.c_int32), ("rank", C.c_int32), ("max_elems", C.c_int64), ("max_blocks", C.c_int32),
                ("reserved", C.c_int32), ("stage", C.c_void_p * MAX_WORLD), ("flags", C.c_void_p * MAX_WORLD),
                ("epochs", C.c_void_p)]


def arena_offsets(world: int, max_elems: int) -> tuple[int, int, int]:
    """(flags offset, epochs offset, total bytes) of an arena; the stage starts at 0."""
    stage = 2 * world * max_elems * 2
    flags = 2 * MAX_BLOCKS * MAX_WORLD * 4
    return stage, stage + flags, stage + flags + MAX_BLOCKS * 4


class P2PAllReduce:
    def __init__(self, rank: int, world: int, store, max_elems: int, device, key: str = "blink/p2p"):
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"the peer-to-peer all-reduce runs on 2 to {MAX_WORLD} ranks, not {world}")
        if max_elems % 8:
            raise ValueError("max_elems must be a multiple of 8")
        self.lib = lib = load_device_library()
        if C.sizeof(P2PAllReduceParams) != lib.blink_p2p_params_bytes():
            raise RuntimeError("P2PAllReduceParams does not match csrc/p2p_allreduce.cu")
        self.rank, self.world, self.max_elems = rank, world, max_elems
        flags_at, epochs_at, total = arena_offsets(world, max_elems)
        self.arena = torch.zeros(total, dtype=torch.uint8, device=device)
        _, handle, _, block_offset, *_ = self.arena.untyped_storage()._share_cuda_()
        torch.cuda.synchronize(device)  # the zeroed flags are in place before any peer can write them
        store.set(f"{key}/{rank}", pickle.dumps((raw_ipc_handle(handle), block_offset + self.arena.storage_offset())))
        self.blocks = []  # mapped peer allocations, closed by close()
        bases = []
        for j in range(world):
            if j == rank:
                bases.append(self.arena.data_ptr())
                continue
            raw, offset = pickle.loads(store.get(f"{key}/{j}"))
            block = C.c_void_p()
            cuda_check(lib, lib.blink_ipc_open(raw, C.byref(block)), f"cudaIpcOpenMemHandle (rank {j})")
            self.blocks.append(block.value)
            bases.append(block.value + offset)
        params = P2PAllReduceParams(world=world, rank=rank, max_elems=max_elems, max_blocks=MAX_BLOCKS,
                                    epochs=self.arena.data_ptr() + epochs_at)
        for j, base in enumerate(bases):
            params.stage[j], params.flags[j] = base, base + flags_at
        raw_params = np.frombuffer(bytes(params), dtype=np.uint8).copy()
        self.params = torch.from_numpy(raw_params).to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place. Every rank calls with the same sizes in the same order."""
        n = x.numel()
        if x.dtype != torch.bfloat16 or not x.is_contiguous() or n % 8 or n > self.max_elems:
            raise ValueError(f"p2p all-reduce takes contiguous bf16 of a multiple of 8 up to {self.max_elems} "
                             f"elements, not {x.dtype} x {n}")
        stream = torch.cuda.current_stream(x.device).cuda_stream
        cuda_check(self.lib, self.lib.blink_p2p_allreduce_bf16(self.params.data_ptr(), MAX_BLOCKS, x.data_ptr(),
                                                               x.data_ptr(), n, stream), "p2p all-reduce launch")
        return x

    def close(self) -> None:
        for block in self.blocks:
            self.lib.blink_ipc_close(block)
        self.blocks = []
