"""blink's own one-shot all-reduces of bf16 through peer memory (csrc/p2p_allreduce.cu), the alternatives to
NCCL inside the forward graphs (issue 7 asks to measure both; blink/bench/allreduce.py does):
- `ll`: the low-latency kernel, each 8 bytes of payload sent with its flags in one 16-byte store; for
  decode-sized tensors, which the model sends here with `--all-reduce p2p` (blink/parallel/group.py);
- `push`: push the input, fence, raise a flag; measured for prefill sizes only.
Each rank allocates one arena, publishes its CUDA IPC handle on the rendezvous store and maps every peer's
arena for its own device. A call is one kernel on the caller's stream, so it can be captured in a graph and
launched from the GPU; every rank must make the same calls in the same order (as with NCCL).
"""
from __future__ import annotations

import ctypes as C
import pickle

import numpy as np
import torch

from blink.device.build import load_device_library
from blink.device.device_graphs import cuda_check
from blink.parallel.ipc import ipc_export, ipc_open

MAX_WORLD = 8  # csrc/p2p_allreduce.cu kMaxWorld
MAX_BLOCKS = 64
DEFAULT_LL_MAX_ELEMS = 256 * 1024  # 512 KiB of bf16: a decode step of up to 64 tokens at hidden 4096


class P2PAllReduceParams(C.Structure):  # csrc/p2p_allreduce.cu
    _fields_ = [("world", C.c_int32), ("rank", C.c_int32), ("max_elems", C.c_int64), ("max_blocks", C.c_int32),
                ("reserved", C.c_int32), ("stage", C.c_void_p * MAX_WORLD), ("flags", C.c_void_p * MAX_WORLD),
                ("epochs", C.c_void_p), ("ll_max_elems", C.c_int64), ("lines", C.c_void_p * MAX_WORLD),
                ("ll_state", C.c_void_p)]


def arena_layout(world: int, max_elems: int, ll_max_elems: int) -> dict[str, int]:
    """Byte offsets of an arena's regions (csrc/p2p_allreduce.cu's header), and its total size."""
    sizes = {"stage": 2 * world * max_elems * 2, "flags": 2 * MAX_BLOCKS * MAX_WORLD * 4, "epochs": MAX_BLOCKS * 4,
             "lines": 2 * world * (ll_max_elems // 4) * 16, "ll_state": 2 * 8}
    layout, at = {}, 0
    for name, size in sizes.items():
        layout[name] = at
        at += -(-size // 16) * 16  # 16-byte aligned regions (the lines are 16-byte stores)
    layout["total"] = at
    return layout


class P2PAllReduce:
    """max_elems: the push kernel's largest call (0: no push region); ll_max_elems: the LL kernel's."""

    def __init__(self, rank: int, world: int, store, device, max_elems: int = 0,
                 ll_max_elems: int = DEFAULT_LL_MAX_ELEMS, key: str = "blink/p2p"):
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"the peer-to-peer all-reduce runs on 2 to {MAX_WORLD} ranks, not {world}")
        if max_elems % 8 or ll_max_elems % 8:
            raise ValueError("max_elems and ll_max_elems must be multiples of 8")
        self.lib = lib = load_device_library()
        if C.sizeof(P2PAllReduceParams) != lib.blink_p2p_params_bytes():
            raise RuntimeError("P2PAllReduceParams does not match csrc/p2p_allreduce.cu")
        self.rank, self.world, self.max_elems, self.ll_max_elems = rank, world, max_elems, ll_max_elems
        layout = arena_layout(world, max_elems, ll_max_elems)
        self.arena = torch.zeros(layout["total"], dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)  # the zeroed flags are in place before any peer can write them
        store.set(f"{key}/{rank}", pickle.dumps(ipc_export(self.arena)))
        self.blocks = []  # mapped peer allocations, closed by close()
        bases = []
        for j in range(world):
            if j == rank:
                bases.append(self.arena.data_ptr())
                continue
            block, base = ipc_open(lib, *pickle.loads(store.get(f"{key}/{j}")), f"cudaIpcOpenMemHandle (rank {j})")
            self.blocks.append(block)
            bases.append(base)
        mine = self.arena.data_ptr()
        params = P2PAllReduceParams(world=world, rank=rank, max_elems=max_elems, max_blocks=MAX_BLOCKS,
                                    epochs=mine + layout["epochs"], ll_max_elems=ll_max_elems,
                                    ll_state=mine + layout["ll_state"])
        for j, base in enumerate(bases):
            params.stage[j], params.flags[j] = base + layout["stage"], base + layout["flags"]
            params.lines[j] = base + layout["lines"]
        raw_params = np.frombuffer(bytes(params), dtype=np.uint8).copy()
        self.params = torch.from_numpy(raw_params).to(device)

    def fits_ll(self, x: torch.Tensor) -> bool:
        """Whether the LL kernel takes x: contiguous bf16, a multiple of 4 elements up to ll_max_elems. Only
        shapes decide (never addresses, which may differ between ranks), so every rank decides alike."""
        n = x.numel()
        return x.dtype == torch.bfloat16 and x.is_contiguous() and 0 < n <= self.ll_max_elems and n % 4 == 0

    def ll(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place, with the LL kernel (x 8-byte aligned: any fresh allocation is)."""
        if not self.fits_ll(x) or x.data_ptr() % 8:
            raise ValueError(f"the LL all-reduce takes contiguous, 8-byte aligned bf16 of a multiple of 4 up to "
                             f"{self.ll_max_elems} elements, not {x.dtype} x {x.numel()}")
        return self._launch(self.lib.blink_p2p_allreduce_ll_bf16, x, "LL all-reduce launch")

    def push(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place, with the push kernel."""
        n = x.numel()
        if x.dtype != torch.bfloat16 or not x.is_contiguous() or n % 8 or n > self.max_elems:
            raise ValueError(f"the push all-reduce takes contiguous bf16 of a multiple of 8 up to "
                             f"{self.max_elems} elements, not {x.dtype} x {n}")
        return self._launch(self.lib.blink_p2p_allreduce_bf16, x, "push all-reduce launch")

    def _launch(self, fn, x: torch.Tensor, what: str) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        cuda_check(self.lib, fn(self.params.data_ptr(), MAX_BLOCKS, x.data_ptr(), x.data_ptr(), x.numel(), stream),
                   what)
        return x

    def close(self) -> None:
        for block in self.blocks:
            self.lib.blink_ipc_close(block)
        self.blocks = []
