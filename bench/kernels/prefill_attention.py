"""Issue 17: the paged-attention kernel on prefill chunks alone, tile variants against today's (stage `prefill-attn`):

    python -m bench.kernels.prefill_attention [--tokens 2048,8192,32768] [--chunks 2048@30720] [--variants ...]

One sequence of T query tokens after C cached ones (--tokens T: C = 0; --chunks T@C), llama3-8b's heads by default
(32 q, 8 kv, head_dim 128), bf16, KV paged in 16-token blocks through a shuffled block table (the variants in
BLOCK_SIZES: the same keys and values in 64- or 128-token blocks). Each variant is an AttentionTuning (the chunk
tiles' rows, KV tile, warps, pipeline stages, the causal split, the warp-specialised kernel); its time is the
median of CUDA-graph replays with the KV cycled through copies beyond the L2 (step_kernels.py's graph_time_us).
TFLOP/s counts the causal work: 4 * head_dim * q heads * the keys each query sees; "of peak" is against the
H200's 790 TFLOP/s (bf16 dense). err: the max relative error against the "today" variant's output, and
against paged_attention_ref where T * (T + C) is at most --ref-max (the torch reference holds every score).
"""
from __future__ import annotations

import argparse

import torch
import triton

from bench.kernels import step_kernels as sk
from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from blink.kernels.attention_ws import WS_BLOCK_Q, WS_REFUSED, ws_chunk_runs

PEAK_TFLOPS = 790.0  # H200 bf16 dense
BLOCK_SIZE = 16


def _tiles(rows: int, warps: int, block_n: int, stages: int, split: bool = True, **loop) -> AttentionTuning:
    return AttentionTuning(prefill_block_m=rows, prefill_num_warps=warps, prefill_block_n=block_n,
                           prefill_num_stages=stages, prefill_causal_split=split, prefill_min_tokens=0, **loop)


# the inner-loop variants of issue 17 (blink/kernels/attention_tile.py)
EXP2 = dict(prefill_scale_in_exp2=True)  # the max over the raw scores, the scale inside exp2's FMA
PAGE = dict(prefill_const_page=True)  # the KV block size (16) compiled in: the gather's address math out of the loop
LAZY = dict(prefill_lazy_rescale=8.0)  # FA4's threshold: rescale only when a row's max grows by more than 2^8


# name -> tuning (names without commas: --variants takes a list); "today" is the default, the others its rivals
VARIANTS = {
    "today": AttentionTuning(),  # session 17's s5-page-exp2 from 2,048 tokens, page below (attention_plan.py)
    "today-unsplit": AttentionTuning(prefill_causal_split=False),
    # 128 rows, 8 warps, n128, 2 stages, causal split (session 16's sweep), none of session 17's loop variants
    "session16": AttentionTuning(prefill_num_stages=2, prefill_scale_in_exp2=False, prefill_const_page=False),
    "session15": _tiles(64, 4, 64, 3),  # the tiles before session 16, with the causal split
    "session15-unsplit": _tiles(64, 4, 64, 3, split=False),  # the kernel before session 16
    "m128-w4-n128-s2": _tiles(128, 4, 128, 2),
    "m128-w16-n128-s2": _tiles(128, 16, 128, 2),
    "m128-w8-n64-s2": _tiles(128, 8, 64, 2),
    "m64-w4-n128-s2": _tiles(64, 4, 128, 2),
    # Session 17. Today's 2 stages issue tile j+1's K/V (cp.async) after tile j's PV dot and wait for them at the top
    # of j+1, with the block-table loads synchronous in between: the loads overlap only the PV dot. 3 stages move the
    # table loads onto cp.async a tile ahead (K/V still one tile ahead); 5 stages give K/V two tiles ahead (3 buffers,
    # 225 KB of shared memory at n128: one program per SM as today), n64 with 7 stages three.
    "m128-w8-n128-s3": _tiles(128, 8, 128, 3),
    "m128-w8-n128-s5": _tiles(128, 8, 128, 5),
    "m128-w8-n64-s5": _tiles(128, 8, 64, 5),
    "m128-w8-n64-s7": _tiles(128, 8, 64, 7),
    # The loop's SASS (tools/attn_sass.py) per tile and warp: session 16's 831 instructions unmasked (1,148 masked), a
    # third of them integer address math; page 652, exp2 769, both 590 (921 masked); lazy adds 3 barriers a tile.
    # Since session 17 the defaults include page (and exp2 in the big tiles), so these rows differ from today less.
    "exp2": AttentionTuning(**EXP2),
    "page": AttentionTuning(**PAGE),
    "page-exp2": AttentionTuning(**PAGE, **EXP2),
    "page-exp2-lazy8": AttentionTuning(**PAGE, **EXP2, **LAZY),
    "s5-page-exp2": _tiles(128, 8, 128, 5, **PAGE, **EXP2),
    "s5-page-exp2-lazy8": _tiles(128, 8, 128, 5, **PAGE, **EXP2, **LAZY),
    "n64-s7-page-exp2": _tiles(128, 8, 64, 7, **PAGE, **EXP2),
    # 256 rows read each K/V tile for 64 query tokens: half today's L2 stream per FLOP (at 1.3x the floor, 128-row
    # tiles would pull ~4.7 TB/s of K/V from the L2 at 32k); 16 warps cap registers at 128 (some spills in the loop)
    "m256-w16-n64-s3": _tiles(256, 16, 64, 3),
    # Session 27: attention_ws.py (TMA + Triton's Hopper warp specialisation; a KV tile is one cache block), and
    # today's kernel on the same block sizes, so that the block size and the kernel are weighed apart
    "ws-b128": AttentionTuning(prefill_ws=True, prefill_min_tokens=0),
    "ws-b64": AttentionTuning(prefill_ws=True, prefill_min_tokens=0),
    "ws-b64-s4": AttentionTuning(prefill_ws=True, prefill_min_tokens=0, prefill_ws_stages=4),  # K/V 3 tiles ahead
    "ws-b128-s2": AttentionTuning(prefill_ws=True, prefill_min_tokens=0, prefill_ws_stages=2),  # K/V 1 tile ahead
    "ws-b64-s2": AttentionTuning(prefill_ws=True, prefill_min_tokens=0, prefill_ws_stages=2),
    "ws-b128-maskv": AttentionTuning(prefill_ws=True, prefill_min_tokens=0, prefill_ws_mask_v=True),  # attention.py's V
    "today-b128": AttentionTuning(prefill_ws=False, prefill_min_tokens=0),
    "today-gather": AttentionTuning(prefill_page_gather=True),  # 16-token blocks, a tile's entries at once (default)
    "one-entry": AttentionTuning(prefill_page_gather=False),  # 16-token blocks, an entry a key (before session 33)
    "today-b64": AttentionTuning(prefill_ws=False, prefill_min_tokens=0),
}
# the variants on other block sizes than BLOCK_SIZE
BLOCK_SIZES = {"ws-b128-s2": 128, "ws-b64-s2": 64,
               "ws-b128": 128, "ws-b64": 64, "ws-b64-s4": 64, "ws-b128-maskv": 128, "today-b128": 128,
               "today-b64": 64}


def causal_flops(tokens: int, cached: int, num_q_heads: int, head_dim: int) -> int:
    """QK^T and PV over the keys each query sees (query i of the chunk sees cached + i + 1 keys)."""
    visible = tokens * cached + tokens * (tokens + 1) // 2
    return 4 * head_dim * num_q_heads * visible


def _block_order(blocks: int, ordered: bool, device) -> torch.Tensor:
    """Which cache blocks hold the sequence's: shuffled (a fragmented pool, the default) or ascending (a fresh pool's
    LIFO stack hands a prompt consecutive blocks, as the step bench's plans do)."""
    return torch.arange(blocks, device=device) if ordered else torch.randperm(blocks + 1, device=device)[:blocks]


def prefill_batch(tokens: int, cached: int, heads: tuple[int, int], head_dim: int, ordered: bool = False):
    """One sequence of `tokens` queries after `cached` keys over a shuffled (or ordered) paged cache: (q, (K, V)
    caches cycled beyond the L2, query starts, seq lens, block table, scale, KV bytes)."""
    hq, hkv = heads
    dev, dt = sk.DEVICE, sk.DTYPE
    seq_len = tokens + cached
    blocks = triton.cdiv(seq_len, BLOCK_SIZE)
    kv_bytes = 2 * seq_len * hkv * head_dim * torch.finfo(dt).bits // 8
    caches = [tuple(torch.randn(blocks + 1, BLOCK_SIZE, hkv, head_dim, device=dev, dtype=dt) for _ in range(2))
              for _ in range(sk.copies_for(kv_bytes))]
    tables = _block_order(blocks, ordered, dev).int().view(1, blocks)
    q = torch.randn(tokens, hq, head_dim, device=dev, dtype=dt)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
    lens = torch.tensor([seq_len], dtype=torch.int32, device=dev)
    return q, caches, starts, lens, tables, head_dim**-0.5, kv_bytes


def reblocked(caches: list, table: torch.Tensor, seq_len: int, block_size: int, ordered: bool = False):
    """The same keys and values paged in `block_size`-token blocks through a shuffled (or ordered) table: (caches,
    table)."""
    blocks = triton.cdiv(seq_len, block_size)
    order = _block_order(blocks, ordered, table.device)
    out = []
    for pair in caches:
        new = []
        for cache in pair:
            dense = cache[table[0].long()].reshape(-1, *cache.shape[2:])[:seq_len]
            blocked = torch.zeros(blocks + 1, block_size, *cache.shape[2:], device=cache.device, dtype=cache.dtype)
            blocked[order] = torch.nn.functional.pad(dense, (0, 0, 0, 0, 0, blocks * block_size - seq_len)).view(
                blocks, block_size, *cache.shape[2:])
            new.append(blocked)
        out.append(tuple(new))
    return out, order.int().view(1, blocks)


def bench_shape(tokens: int, cached: int, heads: tuple[int, int], head_dim: int, variants: dict, ref_max: int,
                ordered: bool = False):
    """us per variant for one chunk; prints a row per variant."""
    hq, hkv = heads
    seq_len = tokens + cached
    q, caches16, starts, lens, tables16, scale, _ = prefill_batch(tokens, cached, heads, head_dim, ordered)
    paged = {BLOCK_SIZE: (caches16, tables16)}
    for name in variants:
        size = BLOCK_SIZES.get(name, BLOCK_SIZE)
        if size not in paged:
            paged[size] = reblocked(caches16, tables16, seq_len, size, ordered)
    caches, tables = caches16, tables16
    flops = causal_flops(tokens, cached, hq, head_dim)
    ref = paged_attention_ref(q, *caches[0], starts, lens, tables, scale) if tokens * seq_len <= ref_max else None
    print(f"prefill attention: {tokens} tokens after {cached} cached, {hq}/{hkv} heads x {head_dim}, "
          f"{flops / 1e12:.2f} TFLOP (floor {flops / PEAK_TFLOPS / 1e6:.1f} us at {PEAK_TFLOPS:.0f} TFLOP/s), "
          f"{len(caches)} caches cycled, {'ordered' if ordered else 'shuffled'} blocks"
          f"{'' if ref is not None else ', no torch reference (too large)'}", flush=True)
    results, baseline = {}, None
    for name, tuning in variants.items():
        block_size = BLOCK_SIZES.get(name, BLOCK_SIZE)
        caches, tables = paged[block_size]
        run = lambda kv, tuning=tuning, tables=tables: paged_attention_triton(q, *kv, starts, lens, tables, scale,
                                                                              tuning=tuning)
        try:
            out = run(caches[0])
        except RuntimeError as refused:  # attention_ws.WS_REFUSED on a GPU; any other error still stops the bench
            if str(refused) != WS_REFUSED:
                raise
            print(f"  {name:<24} refused: {refused}", flush=True)
            continue
        baseline = out if baseline is None else baseline  # the first variant ("today" unless --variants says)
        err_ref = "" if ref is None else f"ref {sk.rel_err(out, ref):.1e}"
        us = sk.graph_time_us([lambda kv=kv, run=run: run(kv) for kv in caches])
        plan = launch_plan(tokens, 1, hq, hkv, head_dim, tables.shape[1] * block_size, tuning)
        ws = plan.ws_chunk and ws_chunk_runs(q, caches[0][0])
        tflops, rows = flops / us / 1e6, WS_BLOCK_Q if ws else plan.block_q * triton.next_power_of_2(hq // hkv)
        print(f"  {name:<24} {us:10.1f} us {tflops:6.0f} TFLOP/s {tflops / PEAK_TFLOPS:5.1%} of peak  "
              f"err {sk.rel_err(out, baseline):.1e} {err_ref:<12} rows {rows} n{plan.block_n} w{plan.num_warps}"
              f" s{plan.num_stages} splits {plan.num_splits}{'' if plan.causal_split else ' unsplit'}"
              f"{' exp2' if plan.scale_in_exp2 else ''}{f' lazy{plan.lazy_rescale:g}' if plan.lazy_rescale else ''}"
              f"{f' page{plan.page(block_size)}' if plan.page(block_size) else ''} block {block_size}"
              f"{' WS' if ws else ''}",
              flush=True)
        results[name] = us
    return flops, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="2048,8192,32768", help="prompts alone (no cached tokens)")
    parser.add_argument("--chunks", default="2048@30720", help="T@C: T tokens after C cached ones; '' for none")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="names from VARIANTS; the first is the baseline")
    parser.add_argument("--heads", default="32/8", help="q heads / kv heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--ref-max", type=int, default=2048 * 32768,
                        help="T * (T + C) up to which to run the torch reference")
    parser.add_argument("--table", choices=("shuffled", "ordered"), default="shuffled",
                        help="the sequence's blocks: a shuffled pool, or consecutive ones (a fresh server's prompt)")
    args = parser.parse_args()
    shapes = [(int(t), 0) for t in args.tokens.split(",") if t]
    shapes += [(int(t), int(c)) for t, c in (chunk.split("@") for chunk in args.chunks.split(",") if chunk)]
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    heads = tuple(int(h) for h in args.heads.split("/"))
    print(f"{torch.cuda.get_device_name()}  triton {triton.__version__}\n")
    summary = []
    for tokens, cached in shapes:
        flops, res = bench_shape(tokens, cached, heads, args.head_dim, variants, args.ref_max,
                                 args.table == "ordered")
        first, best = next(iter(res)), min(res, key=res.get)
        summary.append((f"{tokens}@{cached}", flops / PEAK_TFLOPS / 1e6, res[first], res[best], best))
    print(f"\nSUMMARY: us per layer; the floor at {PEAK_TFLOPS:.0f} TFLOP/s; baseline: the first variant")
    print(f"  {'tokens@cached':<16} {'floor':>9} {'baseline':>10} {'best':>10} {'x floor':>8} {'speedup':>8}  best")
    for shape, floor, base, best_us, best in summary:
        print(f"  {shape:<16} {floor:9.1f} {base:10.1f} {best_us:10.1f} {best_us / floor:8.2f} {base / best_us:8.2f}"
              f"  {best}")


if __name__ == "__main__":
    main()
