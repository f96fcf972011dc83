"""`blink bench allreduce`: NCCL's all-reduce (as the model captures it: a synchronous op on the graph's
stream, graph mixing off) against blink's two one-shot peer-to-peer all-reduces (blink/parallel/
p2p_allreduce.py: `push` and the low-latency `ll`), bf16, on every visible GPU (one process per rank),
for decode- and prefill-sized tensors. Per size: the results compared with NCCL's (max abs difference),
then each captured as a graph of `--iters` back-to-back calls and replayed; the median replay / iters is
the time per call.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

DEFAULT_TOKENS = "1,8,32,128,512"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=4096, help="elements per token (llama3-8b: 4096)")
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help="comma-separated row counts")
    p.add_argument("--iters", type=int, default=50, help="calls per captured graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--world", type=int, default=None, help="ranks (default: every visible GPU)")
    p.add_argument("--result-json", default=None)


def run(ns: argparse.Namespace) -> int:
    import torch
    import torch.multiprocessing as mp

    world = ns.world or torch.cuda.device_count()
    if world < 2:
        print("blink bench allreduce: error: needs two or more CUDA GPUs", file=sys.stderr)
        return 2
    from blink.parallel.group import allow_device_launched_nccl, disable_nvlink_multicast, make_store

    disable_nvlink_multicast()
    allow_device_launched_nccl()
    store = make_store(0, world + 1, 0)  # this process only hosts the store; the ranks are spawned
    sizes = [int(t) * ns.hidden for t in ns.tokens.split(",")]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, world, store.port, sizes, ns.iters, ns.replays, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    if isinstance(rows, str):
        print(f"blink bench allreduce: error: {rows}", file=sys.stderr)
        return 1
    print(f"{'elements':>10} {'KiB':>8} {'nccl us':>9} {'push us':>9} {'ll us':>9} {'push/nccl':>10} "
          f"{'ll/nccl':>8} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['elements']:>10} {r['kib']:>8.0f} {r['nccl_us']:>9.2f} {r['push_us']:>9.2f} {r['ll_us']:>9.2f} "
              f"{r['push_us'] / r['nccl_us']:>10.2f} {r['ll_us'] / r['nccl_us']:>8.2f} {r['max_abs_diff']:>11.3g}")
    if ns.result_json:
        with open(ns.result_json, "w") as f:
            json.dump({"world": world, "hidden": ns.hidden, "iters": ns.iters, "rows": rows}, f, indent=1)
    return 0


def _rank_main(rank: int, world: int, port: int, sizes: list[int], iters: int, replays: int, queue) -> None:
    import torch

    from blink.parallel.group import allow_device_launched_nccl, connect, make_store
    from blink.parallel.p2p_allreduce import P2PAllReduce

    try:
        allow_device_launched_nccl()
        store = make_store(rank + 1, world + 1, port)  # the parent holds index 0 of the store
        group = connect(store, rank, world, "cuda")
        dev = torch.device("cuda", rank)
        p2p = P2PAllReduce(rank, world, store, dev, max_elems=max(sizes), ll_max_elems=max(sizes))
        methods = {"nccl": group.all_reduce, "push": p2p.push, "ll": p2p.ll}
        rows = []
        for n in sizes:
            gen = torch.Generator(device=dev).manual_seed(rank)
            x = torch.randn(n, generator=gen, device=dev).to(torch.bfloat16)
            results = {name: fn(x.clone()) for name, fn in methods.items()}
            torch.cuda.synchronize(dev)
            diff = max((results[name].float() - results["nccl"].float()).abs().max().item() for name in ("push", "ll"))
            row = {"elements": n, "kib": n * 2 / 1024, "max_abs_diff": diff}
            row.update({f"{name}_us": _time(fn, x.clone(), iters, replays, group) for name, fn in methods.items()})
            rows.append(row)
        if rank == 0:
            queue.put(rows)
        group.cpu_group.barrier().wait()
        p2p.close()
    except Exception as e:  # the parent waits on the queue: tell it
        queue.put(f"rank {rank}: {type(e).__name__}: {e}")
        raise


def _time(fn, x, iters: int, replays: int, group) -> float:
    """Median us per call over `replays` replays of a graph of `iters` calls (ranks start together)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn(x)
    per_call = []
    for _ in range(replays):
        group.cpu_group.barrier().wait()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / iters)
    return float(np.median(per_call))
