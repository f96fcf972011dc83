"""MoE block kernels on the GPU, from a CUDA graph, against the bytes they must read.

    .venv/bin/python -m bench.kernels.moe_block [--batches 1,8,32,128,2048] [--experts 128 --top-k 8
                                                --hidden 2048 --inter 768 --tp 1]

Defaults are one Qwen3-30B-A3B layer (--tp N: one rank's slice of each expert). Per batch: the routing and
sort kernels alone, then the whole block (route, sort, both grouped GEMMs, the sum over k), and where the pairs
fit moe_gemv.MAX_PAIRS the block with the experts as weight streams (route, gate_up, down: "streams", side by
side with the sort and GEMMs in one run); the floor is the bytes of the experts actually routed to (counted from
this batch's routing) plus the activations, at the copy bandwidth of blink/bench/roofline.py; err is the block
against its torch reference.
"""
from __future__ import annotations

import argparse

import torch

from bench.kernels.step_kernels import graph_time_us, rel_err
from blink.bench.roofline import COPY_BW
from blink.kernels.moe import (
    align_triton,
    block_m_for,
    experts_ref,
    fused_moe_triton,
    route_ref,
    route_triton,
)
from blink.kernels.moe_gemv import MAX_PAIRS

DEVICE = "cuda"
DTYPE = torch.bfloat16


def bench_batch(tokens: int, experts: int, top_k: int, hidden: int, inter: int) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(DTYPE)
    w13 = (0.02 * torch.randn(experts, 2 * inter, hidden, device=DEVICE, generator=g)).to(DTYPE)
    w2 = (0.02 * torch.randn(experts, hidden, inter, device=DEVICE, generator=g)).to(DTYPE)
    logits = torch.randn(tokens, experts, device=DEVICE, generator=g).to(DTYPE)
    ids, weights = route_ref(logits, top_k, True)
    touched = torch.unique(ids).numel()
    nbytes = touched * 3 * hidden * inter * w13.element_size() + 2 * tokens * hidden * x.element_size()
    route_us = graph_time_us([lambda: route_triton(logits, top_k, True)])
    ids_t, _ = route_triton(logits, top_k, True)
    align_us = graph_time_us([lambda: align_triton(ids_t, experts, block_m_for(ids_t.numel(), experts))])
    block_us = graph_time_us([lambda: fused_moe_triton(x, logits, w13, w2, top_k, True)])
    expected = experts_ref(x, w13, w2, ids, weights)
    err = rel_err(fused_moe_triton(x, logits, w13, w2, top_k, True), expected)
    floor_us = nbytes / COPY_BW * 1e6
    print(f"batch {tokens:5d}: experts touched {touched:4d}  route {route_us:7.1f} us  align {align_us:7.1f} us"
          f"  block {block_us:8.1f} us  floor {floor_us:8.1f} us  ratio {block_us / floor_us:5.2f}"
          f"  {nbytes / block_us / 1e3:6.0f} GB/s  err {err:.1e}", flush=True)
    row = {"batch": tokens, "touched": touched, "route_us": route_us, "align_us": align_us,
           "block_us": block_us, "floor_us": floor_us, "err": err}
    if tokens * top_k <= MAX_PAIRS:
        streams = lambda: fused_moe_triton(x, logits, w13, w2, top_k, True, gemv_pairs=MAX_PAIRS)
        streams_us = graph_time_us([streams])
        streams_err = rel_err(streams(), expected)
        print(f"            streams (moe_gemv.py)  block {streams_us:8.1f} us  ratio {streams_us / floor_us:5.2f}"
              f"  {nbytes / streams_us / 1e3:6.0f} GB/s  err {streams_err:.1e}  speedup {block_us / streams_us:5.2f}",
              flush=True)
        row.update(streams_us=streams_us, streams_err=streams_err)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32,128,2048")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--tp", type=int, default=1, help="bench one rank's slice of each expert")
    ns = p.parse_args(argv)
    inter = ns.inter // ns.tp
    return [bench_batch(int(b), ns.experts, ns.top_k, ns.hidden, inter) for b in ns.batches.split(",")]


if __name__ == "__main__":
    main()
