"""A tensor-parallel group: this rank's place in it and its collectives, passed explicitly (no
torch.distributed default group, so several engines may live in one process, e.g. in tests).

Two communicators: `device_group` carries only the model's all-reduce / all-gather (NCCL on GPUs, so
they can be captured in CUDA graphs; gloo on the CPU), and `cpu_group` (always gloo) carries set-up and
shutdown (host mode's steps go through step_queue.py). Device-mode TP launches captured NCCL graphs from
the GPU with NCCL_GRAPH_MIXING_SUPPORT=0, where no uncaptured call may touch that communicator.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

# NVLink multicast stays off in every rank process (see issue 7).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SETUP_TIMEOUT = datetime.timedelta(seconds=300)


def disable_nvlink_multicast() -> None:
    os.environ.update(NO_MULTICAST_ENV)


def allow_device_launched_nccl() -> None:
    """Device-mode TP launches graphs holding NCCL kernels from the GPU: with graph mixing support on,
    NCCL adds event nodes that device launch refuses. NCCL reads it once per process, at its first use, so
    every TP rank of either mode sets it before any communicator exists (host mode runs no uncaptured
    collective while its graphs may run either, which is what graph mixing support is for)."""
    os.environ["NCCL_GRAPH_MIXING_SUPPORT"] = "0"


@dataclass
class TPGroup:
    rank: int
    size: int
    device_group: dist.ProcessGroup
    cpu_group: dist.ProcessGroup

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (CUDA-graph capturable on NCCL)."""
        _wait(self.device_group.allreduce([x], _sync_op(dist.AllreduceOptions())))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[N, D] per rank -> [N, size * D]: the ranks' shards side by side along the last dim."""
        stacked = torch.empty((self.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        # rank r's x at rows r*N...
        _wait(self.device_group._allgather_base(stacked, x.contiguous(), _sync_op(AllgatherOptions())))
        return stacked.view(self.size, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])

    def min_over_ranks(self, value: int) -> int:
        x = torch.tensor([value], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.cpu_group.allreduce([x], opts).wait()
        return int(x.item())


def _sync_op(opts):
    """A collective on the caller's stream (asyncOp off): with it on, ProcessGroupNCCL runs the kernel on
    its own stream, joined by event record / wait nodes that a device-launched graph may not hold."""
    opts.asyncOp = False
    return opts


def _wait(work) -> None:
    if work is not None:  # NCCL returns no Work for a synchronous op; gloo always does
        work.wait()


def make_store(rank: int, size: int, port: int) -> dist.TCPStore:
    """Rank 0 hosts the rendezvous store (port 0 = pick a free one: read it back from .port)."""
    return dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=SETUP_TIMEOUT,
                         wait_for_workers=False)


def connect(store: dist.TCPStore, rank: int, size: int, device: str) -> TPGroup:
    """Join the group: every rank calls this with the same size; device is 'cpu' or 'cuda' (cuda:rank)."""
    cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, size, SETUP_TIMEOUT)
    if device == "cuda":
        torch.cuda.set_device(rank)
        device_group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size)
        device_group.allreduce([torch.zeros(1, device="cuda")]).wait()  # create the communicator now,
        torch.cuda.synchronize()  # before any capture
    else:
        device_group = dist.ProcessGroupGloo(dist.PrefixStore("dev", store), rank, size, SETUP_TIMEOUT)
    return TPGroup(rank, size, device_group, cpu_group)
