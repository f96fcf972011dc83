"""A tensor-parallel group: this rank's place in it and its collectives, passed explicitly (no
torch.distributed default group, so several engines may live in one process, e.g. in tests).

With `--all-reduce p2p` (`auto`, the default, on GPUs), decode-sized bf16 all-reduces go to blink's LL
kernel through peer memory (p2p_allreduce.py) instead of NCCL: 0.56x NCCL's time at 8 KiB on two H200
(docs/perf.md); the rest stays on NCCL.

Two communicators: `device_group` carries only the model's all-reduce / all-gather (NCCL on GPUs, so
they can be captured in CUDA graphs; gloo on the CPU), and `cpu_group` (always gloo) carries set-up and
shutdown (host mode's steps go through step_queue.py). Device-mode TP launches captured NCCL graphs from
the GPU with NCCL_GRAPH_MIXING_SUPPORT=0, where no uncaptured call may touch that communicator.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

# NVLink multicast stays off in every rank process (see issue 7).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SETUP_TIMEOUT = datetime.timedelta(seconds=300)
ALL_REDUCE_CHOICES = ("auto", "nccl", "p2p")  # auto: p2p on GPUs; nccl: torch.distributed (gloo on the CPU)

if TYPE_CHECKING:
    from blink.parallel.p2p_allreduce import P2PAllReduce


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
    p2p: P2PAllReduce | None = None  # --all-reduce p2p: decode-sized bf16 sums go to its LL kernel

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (CUDA-graph capturable on NCCL and on the LL kernel). Every rank takes
        the same branch: only the shape and dtype decide, and those are the same on every rank."""
        if self.p2p is not None and self.p2p.fits_ll(x):
            return self.p2p.ll(x)
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


def check_all_reduce(all_reduce: str, device: str) -> None:
    if all_reduce not in ALL_REDUCE_CHOICES:
        raise ValueError(f"--all-reduce must be one of {', '.join(ALL_REDUCE_CHOICES)}, not {all_reduce!r}")
    if all_reduce == "p2p" and device != "cuda":
        raise ValueError("--all-reduce p2p needs CUDA GPUs (on the CPU the ranks all-reduce with gloo)")


def connect(store: dist.TCPStore, rank: int, size: int, device: str, all_reduce: str = "nccl") -> TPGroup:
    """Join the group: every rank calls this with the same size and all_reduce; device is 'cpu' or 'cuda'
    (cuda:rank)."""
    check_all_reduce(all_reduce, device)
    if all_reduce == "auto":
        all_reduce = "p2p" if device == "cuda" else "nccl"
    cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, size, SETUP_TIMEOUT)
    if device == "cuda":
        torch.cuda.set_device(rank)
        device_group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size)
        device_group.allreduce([torch.zeros(1, device="cuda")]).wait()  # create the communicator now,
        torch.cuda.synchronize()  # before any capture
    else:
        device_group = dist.ProcessGroupGloo(dist.PrefixStore("dev", store), rank, size, SETUP_TIMEOUT)
    p2p = None
    if all_reduce == "p2p" and size > 1:
        from blink.parallel.p2p_allreduce import P2PAllReduce

        p2p = P2PAllReduce(rank, size, store, torch.device("cuda", rank))
    return TPGroup(rank, size, device_group, cpu_group, p2p)
