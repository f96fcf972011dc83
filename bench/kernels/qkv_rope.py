"""Issue 17: qkv's decode GEMV with RoPE and the KV write in its epilogue (kernels/gemv_rope.py) against the two
kernels it replaces (the GEMV, then rope_and_write_kv), alone, at decode batches (stage `qkv-rope`):

    python -m bench.kernels.qkv_rope [--model llama3-8b] [--ms 1,2,8,16] [--tiles 64x256x3,32x512x3]

Both sides run with the add_norm prologue as a layer runs qkv, captured in one CUDA graph over weight copies cycled
past the L2 (step_kernels.graph_time_us), us a layer. err: the fused kernel's qkv and K/V cache against the two
kernels'. A tile is BLOCK_N x BLOCK_K x stages (BLOCK_N must divide head_dim); the first is default_config's. One
row runs gemv.py's CUDA-core loop on both sides (its tiles: 4 or 8 columns, 1 stage), more rows tensor cores.
"""
from __future__ import annotations

import argparse

import torch
import triton

from bench.kernels import step_kernels as sk
from blink.kernels.gemv import GemvConfig, default_config, gemv_triton
from blink.kernels.gemv_rope import gemv_rope_kv_triton
from blink.kernels.rope import rope_and_write_kv_triton
from blink.model import presets


def bench_rows(cfg, m: int, tiles: list[GemvConfig]) -> dict[str, float]:
    hq, hkv, d, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    n = (hq + 2 * hkv) * d
    dev, dt = sk.DEVICE, sk.DTYPE
    weights = [torch.randn(n, hidden, device=dev, dtype=dt) / hidden**0.5 for _ in range(sk.copies_for(n * hidden * 2))]
    x, residual = torch.randn(m, hidden, device=dev, dtype=dt), torch.randn(m, hidden, device=dev, dtype=dt)
    norm_w = torch.rand(hidden, device=dev, dtype=dt) + 0.5
    angles = torch.rand(8192, d // 2, device=dev) * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.randint(0, 8192, (m,), device=dev)
    blocks = m + 1
    caches = [torch.zeros(blocks, sk.BLOCK_SIZE, hkv, d, device=dev, dtype=dt) for _ in range(4)]  # two per side
    slots = torch.randperm(blocks * sk.BLOCK_SIZE, device=dev)[:m]
    print(f"qkv: M={m} K={hidden} N={n} ({hq}/{hkv} heads x {d}), add_norm, {n * hidden * 2 / 1e6:.0f} MB, "
          f"{len(weights)} copies", flush=True)

    def two_kernels(w):
        qkv, _ = gemv_triton(x, w, None, "add_norm", norm_w, 1e-5, residual)
        q, k, v = (t.view(m, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=1))
        rope_and_write_kv_triton(q, k, v, positions, cos_sin, caches[0], caches[1], slots)
        return qkv

    def fused(w, config):
        return gemv_rope_kv_triton(x, w, None, "add_norm", norm_w, 1e-5, residual, positions, cos_sin, caches[2],
                                   caches[3], slots, hq, hkv, config)[0]

    ref = two_kernels(weights[0])
    runs = {"gemv, then rope + KV write": two_kernels}
    runs.update({f"fused n{c.block_n} k{c.block_k} s{c.num_stages}": lambda w, c=c: fused(w, c) for c in tiles})
    results = {}
    for label, run in runs.items():
        try:
            out = run(weights[0])
            err = max(sk.rel_err(out, ref), sk.rel_err(caches[2], caches[0]), sk.rel_err(caches[3], caches[1])) \
                if label != "gemv, then rope + KV write" else 0.0
            us = sk.graph_time_us([lambda w=w, run=run: run(w) for w in weights])
        except Exception as e:  # noqa: BLE001 - one failing tile must not cost the others
            print(f"  {label:<34} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        sk.row(label, us, n * hidden * 2, err, f"{us / results.get('gemv, then rope + KV write', us):.3f}x")
        results[label] = us
    return results


def parse_tiles(text: str, m: int) -> list[GemvConfig]:
    """"64x256x3,32x512x3" -> GEMV tiles (BLOCK_N x BLOCK_K x stages, 4 warps): tensor cores from two rows on."""
    tiles = []
    for spec in text.split(","):
        block_n, block_k, stages = (int(v) for v in spec.split("x"))
        tiles.append(GemvConfig(block_n=block_n, block_k=block_k, num_stages=stages, dot=m > 1))
    return tiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--ms", default="1,2,8,16")
    parser.add_argument("--tiles", default=None, help="default: default_config's tile for the qkv shape, then 32x512x3 "
                                                      "(one row: 8x512x1)")
    args = parser.parse_args()
    cfg = presets.get(args.model)
    print(f"{torch.cuda.get_device_name()}  {args.model}  triton {triton.__version__}  torch {torch.__version__}")
    summary = []
    for m in map(int, args.ms.split(",")):
        n = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
        other = GemvConfig(block_n=32, block_k=512, num_stages=3, dot=True) if m > 1 else GemvConfig(8, 512)
        tiles = parse_tiles(args.tiles, m) if args.tiles else [default_config(n, cfg.hidden_size, m, "add_norm"),
                                                               other]
        summary += [(m, label, us) for label, us in bench_rows(cfg, m, tiles).items()]
    print("\nSUMMARY (us a layer; ratio to the two kernels at the same M)")
    base = {m: us for m, label, us in summary if label.startswith("gemv, then")}
    for m, label, us in summary:
        ratio = f"{us / base[m]:5.3f}x" if m in base else "-"
        print(f"  M={m:<3} {label:<34} {us:8.2f}  {ratio}")


if __name__ == "__main__":
    main()
