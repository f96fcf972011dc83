"""Where attention_ws.py's warp-specialised kernel hangs (issue 17, session 28: it never finished on the H200).

Each case runs in its own process under a time limit, so a hang costs its limit and the next case still runs:
the kernel with and without specialisation, per variant (VARIANTS, the suspected fix first), with each way of
finding a tile's block (attention_ws.WS_TABLE_MODES: a load in the loop, the first entry plus the tile, the row
read before the loop), on shapes from a 256-token prompt to a mixed step. Block tables are contiguous here, so
every mode is right. Prints one line a case: ok with the max error against paged_attention_ref, HANG, or the error.

Session 29's suspect (attention_ws.WS_Q_DESCS): q's host descriptor box [128, D] against the pass's two 64-row
copies. qdev ok + host HANG confirms it; bq64 (q never split) is the control that needs no device descriptor.

    python -m tools.diag_ws [--timeout 30] [--variants qdev,bq64,host] [--modes load] [--device cuda]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

SHAPES = {"prompt256": ([256], [256]), "prompt200": ([200], [200]), "chunk128@512": ([128], [640]),
          "mixed": ([200, 1, 70], [200, 130, 334])}
# launch_ws_chunk's arguments per variant: q's descriptor made in the kernel; q tiles of 64 rows (the pass then
# leaves q whole); today's host descriptor of 128 rows (hung on the H200, session 28)
VARIANTS = {"qdev": {"q_desc": "device"}, "bq64": {"block_q": 64}, "host": {}}


def contiguous(batch):
    """The batch re-paged so that each sequence's blocks are consecutive (block ids in table order)."""
    import torch

    block_size = batch.k_cache.shape[1]
    rows = [row[: -(-int(n) // block_size)] for row, n in zip(batch.block_tables, batch.seq_lens, strict=True)]
    order = torch.cat(rows).long()
    tables = torch.zeros_like(batch.block_tables)
    used = 0
    for s, row in enumerate(rows):
        tables[s, : len(row)] = torch.arange(used, used + len(row), dtype=tables.dtype)
        used += len(row)
    batch.k_cache, batch.v_cache = batch.k_cache[order].contiguous(), batch.v_cache[order].contiguous()
    batch.block_tables = tables
    return batch


def run_case(shape: str, table: str, ws: bool, stages: int, device: str, variant: str = "host",
             repeats: int = 1) -> None:
    import torch

    from blink.kernels.attention import paged_attention_ref
    from blink.kernels.attention_ws import launch_ws_chunk
    from tests.kernels.paged_batch import make_paged_batch

    q_lens, seq_lens = SHAPES[shape]
    batch = contiguous(make_paged_batch(q_lens, seq_lens, 8, 2, head_dim=64, block_size=64, dtype=torch.float16,
                                        device=device))
    args = (batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, 0.125)
    n = sum(q_lens)
    ref = paged_attention_ref(*args)[:n].float()
    outs = []
    for _ in range(repeats):  # a release of a K/V slot before its last read (perf.md, session 29) shows as drift
        outs.append(launch_ws_chunk(*args, warp_specialize=ws, num_stages=stages, table=table,
                                    **VARIANTS[variant])[:n])
        if device == "cuda":
            torch.cuda.synchronize()
    err = max((out.float() - ref).abs().max().item() for out in outs)
    differing = sum(not torch.equal(out, outs[0]) for out in outs[1:])
    print(f"ok maxerr {err:.1e} over {repeats} runs, {differing} differing from the first", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take, compile included")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--modes", default="load", help="of load,contiguous,row (session 28's suspects)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--stages", default="2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=10, help="launches a case, compared bit for bit")
    # shape table ws stages device variant: one case, in this process
    parser.add_argument("--case", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        shape, table, ws, stages, device, variant = args.case
        run_case(shape, table, ws == "1", int(stages), device, variant, args.repeats)
        return
    cases = [(v, sh, t, st, ws) for v in args.variants.split(",") for sh in args.shapes.split(",")
             for t in args.modes.split(",") for st in args.stages.split(",") for ws in ("0", "1")]
    for variant, shape, table, stages, ws in cases:
        case = [shape, table, ws, stages, args.device, variant]
        try:
            command = [sys.executable, "-m", "tools.diag_ws", "--repeats", str(args.repeats), "--case", *case]
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            said = (done.stdout.strip().splitlines() or [""])[-1] if done.returncode == 0 else \
                "error: " + (done.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            said = f"HANG (over {args.timeout:g} s)"
        print(f"{variant:<5} {shape:<14} table {table:<10} stages {stages} ws {ws}: {said}", flush=True)


if __name__ == "__main__":
    main()
