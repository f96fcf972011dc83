"""CUDA IPC between tensor-parallel ranks: export a device arena from one process, map it in another.

Device-mode TP maps each follower's step-buffer arena into rank 0 (its scheduler writes there over NVLink),
and the p2p all-reduce maps every peer's arena into every rank.
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass

import torch

from blink.device.device_graphs import cuda_check

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


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
