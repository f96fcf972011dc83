"""MoE block kernels on the GPU, from a CUDA graph, against the bytes they must read.

    .venv/bin/python -m bench.kernels.moe_block [--batches 1,8,32,128,2048] [--experts 128 --top-k 8
                                                --hidden 2048 --inter 768 --tp 1]
                                                [--stream-tiles "4x1024w4s2,8x512w4s3;4x1024w4s2,2x2048w4s2"]

Defaults are one Qwen3-30B-A3B layer (--tp N: one rank's slice of each expert). Per batch: the routing and
sort kernels alone, then the whole block (route, sort, both grouped GEMMs, the sum over k), and where the pairs
fit moe_gemv.MAX_PAIRS the block with the experts as weight streams (route, gate_up, down: "streams", side by
side with the sort and GEMMs in one run; --stream-tiles: the two streams alone in each gate_up tile, then in each
down tile, BLOCK_N x BLOCK_K, warps, stages, beside moe_gemv's default tiles); the floor is the bytes of the experts
actually routed to (counted from this batch's routing) plus the activations, at the copy bandwidth of
blink/bench/roofline.py; err is the block against its torch reference.
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
from blink.kernels.moe_gemv import MAX_PAIRS, MoeGemvConfig, default_config, experts_gemv_triton

DEVICE = "cuda"
DTYPE = torch.bfloat16


def parse_tiles(text: str) -> list[MoeGemvConfig]:
    """"4x1024w4s2,8x512w8s3" -> MoeGemvConfig(block_n, block_k, num_warps, num_stages) each."""
    tiles = []
    for word in filter(None, text.split(",")):
        size, rest = word.split("w")
        warps, stages = rest.split("s")
        block_n, block_k = size.split("x")
        tiles.append(MoeGemvConfig(int(block_n), int(block_k), int(warps), int(stages)))
    return tiles


def sweep_stream_tiles(x, w13, w2, ids, weights, expected, nbytes: float, gate_up_tiles, down_tiles) -> list[dict]:
    """The two streams alone (route excluded) in each gate_up tile with down's default, then each down tile with
    gate_up's default; the first row is both defaults."""
    tokens, top_k = ids.shape
    hidden, inter = x.shape[1], w2.shape[2]
    up_default = default_config(inter, hidden, tokens * top_k)
    down_default = default_config(hidden, inter, tokens)
    combos = [("default", up_default, down_default)] + [("gate_up", t, down_default) for t in gate_up_tiles] \
        + [("down", up_default, t) for t in down_tiles]
    rows = []
    for which, up, down in combos:
        run = lambda up=up, down=down: experts_gemv_triton(x, w13, w2, ids, weights, up, down)
        tile = up if which == "gate_up" else down
        try:
            us = graph_time_us([run])
            err = rel_err(run(), expected)
        except Exception as failed:  # a tile that does not build (registers, shared memory): the sweep goes on
            print(f"            streams alone, {which:<7} {tile}: {type(failed).__name__}: {failed}"[:300], flush=True)
            continue
        print(f"            streams alone, {which:<7} {tile.block_n}x{tile.block_k}w{tile.num_warps}s{tile.num_stages}"
              f" (gate_up {up.block_n}x{up.block_k}, down {down.block_n}x{down.block_k})  {us:8.1f} us"
              f"  {nbytes / us / 1e3:6.0f} GB/s  err {err:.1e}", flush=True)
        rows.append({"which": which, "gate_up": up, "down": down, "us": us, "err": err})
    return rows


def bench_batch(tokens: int, experts: int, top_k: int, hidden: int, inter: int,
                stream_tiles: tuple[list, list] | None = None) -> dict:
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
        if stream_tiles:
            row["tiles"] = sweep_stream_tiles(x, w13, w2, ids, weights.float().contiguous(), expected, nbytes,
                                              *stream_tiles)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32,128,2048")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--tp", type=int, default=1, help="bench one rank's slice of each expert")
    p.add_argument("--stream-tiles", default="", help="GATE_UP;DOWN tiles of the streams to time alone, each a comma "
                   "list of BLOCK_NxBLOCK_KwWARPSsSTAGES (e.g. 4x1024w4s2,8x512w4s3;2x2048w4s2)")
    ns = p.parse_args(argv)
    inter = ns.inter // ns.tp
    tiles = None
    if ns.stream_tiles:
        gate_up, _, down = ns.stream_tiles.partition(";")
        tiles = (parse_tiles(gate_up), parse_tiles(down))
    return [bench_batch(int(b), ns.experts, ns.top_k, ns.hidden, inter, tiles) for b in ns.batches.split(",")]


if __name__ == "__main__":
    main()
