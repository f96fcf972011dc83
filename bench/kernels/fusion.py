"""Issue 17's per-layer levers on the GPU, old against new, in one run (stage `fusion` of tools/gpu_run.sh):

    python -m bench.kernels.fusion [--model llama3-8b] [--context 1024[,8192,32768]] [--batches 1,8,32] [--ms 1,2,4,8]

1. gemv: each projection of one layer (and the LM head) at M rows, what the model runs today (the norm or
   SiLU-mul kernel, then cuBLAS) against the GEMV with that op in its prologue, PDL off and on, and a few
   tile configs besides the default; err is the max relative error against the torch reference (bf16).
2. step: the whole decode step (forward + logits, one CUDA graph, context tokens per sequence) at each
   batch with each lever off and on: baseline, PDL, GEMV, GEMV + PDL (with session 11's down_proj tiles, and as
   today); kernels per step from a profiled
   eager step; the logits' agreement with the baseline (max relative error, argmax equal).
The closing table gives what to set: the projections where the GEMV wins (BLINK_GEMV), up to which M
(BLINK_GEMV_MAX_M), and whether PDL pays (BLINK_PDL). Times are medians of graph replays, inputs cycled
beyond the L2 as in step_kernels.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F
import triton

from bench.kernels import attention_variants as av
from bench.kernels import step_kernels as sk
from blink.kernels.activation import silu_and_mul_triton
from blink.kernels.attention import default_tuning_switched
from blink.kernels.attention_plan import AttentionTuning
from blink.kernels.gemv import GemvConfig, GemvPlan, gemv_ref, gemv_triton
from blink.kernels.pdl import pdl_switched
from blink.kernels.rmsnorm import rms_norm_triton
from blink.model.fusion import DEFAULT_MAX_M, PROJECTIONS, FusionPolicy, apply_fusion_policy

PROLOGUE_OF = {"qkv": "add_norm", "o": "none", "gate_up": "add_norm", "down": "silu_mul", "lm_head": "none"}
SESSION11_DOWN = GemvConfig(block_n=4, block_k=1024)  # down_proj's tiles before session 12 (a sweep row too)
SWEEP = [GemvConfig(block_n=8, block_k=512), GemvConfig(block_n=16, block_k=256), GemvConfig(block_n=2, block_k=2048),
         GemvConfig(block_n=8, block_k=512, num_warps=8), GemvConfig(block_n=4, block_k=1024, num_stages=3),
         GemvConfig(block_n=16, block_k=256, dot=True), GemvConfig(block_n=32, block_k=128, dot=True),
         GemvConfig(block_n=16, block_k=512, num_warps=8), GemvConfig(block_n=8, block_k=1024, num_warps=8),
         SESSION11_DOWN]
# Tensor cores fed by Triton's pipeliner (num_stages - 1 W tiles in flight through shared memory): the
# candidates for M > 1, where the CUDA-core loop ran at 0.27x cuBLAS at M = 8 (session 14)
DOT_SWEEP = [GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s, dot=True) for bn, bk, w, s in [
    (16, 256, 4, 3), (16, 512, 2, 4), (32, 256, 4, 4), (32, 512, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3),
    (64, 256, 4, 4), (64, 512, 4, 2), (128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4)]]
# gate|up with the SiLU-mul epilogue streams two W tiles a step (gemv_rows.py): half the K step for the same memory
SILU_SWEEP = [GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s, dot=True) for bn, bk, w, s in [
    (32, 256, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4), (64, 64, 4, 6), (64, 128, 4, 4), (128, 64, 4, 4),
    (128, 64, 8, 4), (128, 128, 8, 3)]]
# --sweep NAME -> its tiles, read at call time (the dry-run test swaps SWEEP)
SWEEPS = {"all": lambda: SWEEP, "dot": lambda: DOT_SWEEP, "both": lambda: SWEEP + DOT_SWEEP, "none": lambda: []}
# label: (BLINK_GEMV, BLINK_GEMV_MAX_M, PDL, session 11's down_proj tiles, the attention's tuning). "gemv+pdl" is
# the one-row GEMV (the default until session 17); "gemv+pdl, up to 16 rows" is today's default (DEFAULT_MAX_M),
# and the "gemv+pdl, attention ..." rows weigh one change each against it
DEFAULT_ATTENTION = AttentionTuning()
LEVERS = {"baseline": ("", DEFAULT_MAX_M, False, False, DEFAULT_ATTENTION),
          "pdl": ("", DEFAULT_MAX_M, True, False, DEFAULT_ATTENTION),
          "gemv": ("all", "1", False, False, DEFAULT_ATTENTION),
          "gemv+pdl, session-11 down tiles": ("all", "1", True, True, DEFAULT_ATTENTION),
          "gemv+pdl": ("all", "1", True, False, DEFAULT_ATTENTION),
          # the tensor-core loop at M > 1, default tiles: where it beat cuBLAS alone (o, LM head); everywhere
          "gemv+pdl, o and lm_head up to 16 rows": ("all", "1,o:16,lm_head:16", True, False, DEFAULT_ATTENTION),
          "gemv+pdl, up to 16 rows": ("all", 16, True, False, DEFAULT_ATTENTION),
          # session 17: the one-pass norm and gate|up's SiLU-mul epilogue (gemv_rows.py); down on cuBLAS above 16
          "gemv+pdl, up to 32 rows, down 16": ("all", "32,down:16", True, False, DEFAULT_ATTENTION),
          "gemv+pdl, up to 64 rows, down 16": ("all", "64,down:16", True, False, DEFAULT_ATTENTION),
          "gemv+pdl, up to 64 rows": ("all", 64, True, False, DEFAULT_ATTENTION)}
# rows whose gemv_rows kernels launch with PDL too (pdl.py's "gemv_rows" switch; off by default)
LEVERS.update({f"{label}, rows pdl": value for label, value in LEVERS.items() if "rows" in label})
ROWS_PDL_SUFFIX = ", rows pdl"
# session 25: RoPE and the KV write in qkv's epilogue (kernels/gemv_rope.py; BLINK_QKV_ROPE in the engine)
ROPE_IN_QKV = "gemv+pdl, up to 16 rows, rope in qkv"
LEVERS[ROPE_IN_QKV] = ("all", DEFAULT_MAX_M, True, False, DEFAULT_ATTENTION)
LEVERS.update({f"gemv+pdl, attention {name}": ("all", DEFAULT_MAX_M, True, False, tuning) for name, tuning in [
    ("before session 13", av.BEFORE_SESSION_13), ("merge kernel", AttentionTuning(merge_in_kernel=False)),
    ("split < 4/SM, 4/SM", AttentionTuning(split_below_per_sm=4, programs_per_sm=4)),
    ("unsplit 2 stages", AttentionTuning(unsplit_num_stages=2)),
    ("maxnreg 128", AttentionTuning(decode_maxnreg=128)),
    ("maxnreg 96", AttentionTuning(decode_maxnreg=96)), ("8 warps", AttentionTuning(num_warps=8)),
    ("n32", AttentionTuning(block_n=32)),
    ("batch 1 without the block size compiled in", AttentionTuning(small_grid_const_page=False)),
    ("decode page", AttentionTuning(decode_const_page=True)),
    ("decode page exp2", AttentionTuning(decode_const_page=True, decode_scale_in_exp2=True)),
    ("stages 3", AttentionTuning(num_stages=3)), ("split < 1/SM", AttentionTuning(split_below_per_sm=1)),
    ("no small grid", AttentionTuning(small_grid_programs=None)),
    ("host split count at batch 1", av.HOST_SPLITS),
    # issue 17: the first KV tile's table entries and an L2 prefetch of its cached K/V before the PDL wait
    ("early table", AttentionTuning(early_table=True))]})

def _call_shape(name: str, m: int) -> tuple[str, str]:
    """(prologue, epilogue) of a projection at M rows, as the model calls it: from two rows on gate|up applies
    the SiLU-mul in its epilogue and down reads the activation as is."""
    if m > 1 and name == "gate_up":
        return "add_norm", "silu_mul"
    if m > 1 and name == "down":
        return "none", "none"
    return PROLOGUE_OF[name], "none"


def bench_projection(name: str, k: int, n: int, m: int, sweep: list[GemvConfig]) -> dict[str, float]:
    """us per call: today's kernels vs the GEMV (default config, PDL off/on, the sweep)."""
    prologue, epilogue = _call_shape(name, m)
    dev, dt = sk.DEVICE, sk.DTYPE
    weights = [torch.randn(n, k, device=dev, dtype=dt) / k**0.5 for _ in range(sk.copies_for(n * k * 2))]
    x = torch.randn(m, 2 * k if prologue == "silu_mul" else k, device=dev, dtype=dt)
    residual = torch.randn(m, k, device=dev, dtype=dt) if prologue == "add_norm" else None
    norm_w = torch.rand(k, device=dev, dtype=dt) + 0.5 if prologue == "add_norm" else None
    extra = dict(prologue=prologue, norm_weight=norm_w, eps=1e-5, residual=residual, epilogue=epilogue)
    ref = gemv_ref(x.float(), weights[0].float(), None, prologue, None if norm_w is None else norm_w.float(), 1e-5,
                   None if residual is None else residual.float(), epilogue=epilogue)
    ref = ref[0] if prologue == "add_norm" else ref
    print(f"{name}: M={m} K={k} N={n} prologue {prologue} epilogue {epilogue} ({n * k * 2 / 1e6:.0f} MB, "
          f"{len(weights)} copies)")

    def today(w):
        if prologue == "add_norm":
            out = F.linear(rms_norm_triton(x, norm_w, 1e-5, residual)[0], w)
            return silu_and_mul_triton(out) if epilogue == "silu_mul" else out
        return F.linear(silu_and_mul_triton(x) if prologue == "silu_mul" else x, w)

    def new(config):
        def call(w):
            out = gemv_triton(x, w, None, config=config, **extra)
            return out[0] if prologue == "add_norm" else out
        return call

    variants = {"today (kernels + cuBLAS)": (today, False), "gemv": (new(None), False),
                "gemv + pdl": (new(None), True)}
    if prologue == "silu_mul":  # the bound a SiLU computed once (in gate_up's epilogue) would leave
        x_act = silu_and_mul_triton(x)
        variants["gemv on silu(gate)*up (bound)"] = (lambda w: gemv_triton(x_act, w, None), False)
    if sweep:
        # more rows run on tensor cores only
        tiles = SILU_SWEEP if epilogue == "silu_mul" else [c for c in sweep if c.dot or m == 1]
        for config in tiles:
            label = (f"gemv n{config.block_n} k{config.block_k} w{config.num_warps} s{config.num_stages}"
                     + (" dot" if config.dot else ""))
            variants[label] = (new(config), False)
    results = {}
    for label, (fn, pdl) in variants.items():
        try:
            with pdl_switched(pdl), pdl_switched(pdl, "gemv_rows"):
                err = sk.rel_err(fn(weights[0]), ref)
                us = sk.graph_time_us([lambda w=w, fn=fn: fn(w) for w in weights])
        except Exception as e:  # noqa: BLE001 - one failing variant must not cost the lead the whole run
            print(f"  {label:<34} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        sk.row(label, us, n * k * 2, err)
        results[label] = us
    return results


def count_kernels(step) -> int:
    """CUDA kernels one eager run of `step` launches (the profiler's device-side events)."""
    if not torch.cuda.is_available():
        return 0
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported as -1, the timings still count
        print(f"  (kernel count unavailable: {type(e).__name__}: {str(e)[:120]})")
        return -1
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def bench_step(model_name: str, batches: list[int], contexts: list[int], max_model_len: int,
               levers: str = "all", repeats: int = 1) -> list[tuple]:
    """Rows (batch, context, label, us, x floor, kernels): every chosen lever `repeats` times, the levers interleaved
    within each round so that drift hits them all alike (kernels counted in the first round only)."""
    from blink.model.weights import load_model

    model, cfg = load_model(model_name, sk.DEVICE, sk.DTYPE, max_positions=max_model_len)
    weight_bytes = sk.weight_bytes_read(model, cfg)
    rows = []
    for context, batch in ((c, b) for c in contexts for b in batches):  # llama3-8b at 32k: batch 32 needs 137 GB KV
        kv_bytes, floor_us = sk.decode_floor(weight_bytes, cfg, batch, context)
        print(f"whole decode step: batch {batch}, context {context}, floor {floor_us:.0f} us")
        step = sk._decode_step(model, cfg, batch, context, max_model_len)
        baseline_logits, kernels_of = None, {}
        chosen = [(label, lever) for label, lever in LEVERS.items() if levers == "all" or label in levers.split(";")]
        rounds = ((choice, round_) for round_ in range(repeats) for choice in chosen)
        for (label, (gemv, max_m, pdl, old_down, attention)), round_ in rounds:
            policy = FusionPolicy.parse(gemv, max_m)
            taken = apply_fusion_policy(model, dataclasses.replace(policy, rope_in_qkv=label == ROPE_IN_QKV))
            if old_down and gemv:
                for layer in model.model.layers:
                    down = getattr(layer.mlp, "down_proj", None)  # dense layers (MoE blocks keep their kernels)
                    if down is not None and down.gemv is not None:
                        down.gemv = GemvPlan(SESSION11_DOWN, down.gemv.max_m)
            try:
                with torch.inference_mode(), pdl_switched(pdl), default_tuning_switched(attention), \
                        pdl_switched(label.endswith(ROWS_PDL_SUFFIX), "gemv_rows"):
                    logits = step().float()
                    kernels = kernels_of.setdefault(label, count_kernels(step) if round_ == 0 else 0)
                    us = sk.graph_time_us([step], replays=20)
            except Exception as e:  # noqa: BLE001 - e.g. a driver that cannot capture PDL edges
                print(f"  {label:<34} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if baseline_logits is None:
                baseline_logits = logits
            err = sk.rel_err(logits, baseline_logits)
            same = (logits.argmax(-1) == baseline_logits.argmax(-1)).float().mean().item()
            sk.row(label + (f" (round {round_ + 1})" if repeats > 1 else ""), us, weight_bytes + kv_bytes, err,
                   f"{us / floor_us:.3f} x floor  {kernels} kernels ({kernels / cfg.num_hidden_layers:.1f}/layer)  "
                   f"argmax = baseline {same:.0%}  gemv layers {sum(taken.values())}")
            rows.append((batch, context, label, us, us / floor_us, kernels))
    apply_fusion_policy(model, FusionPolicy())
    return rows


def step_summary(rows: list[tuple]) -> dict[tuple, list[tuple]]:
    """bench_step's rows grouped by (batch, context, label) in first-seen order: each lever's (us, x floor, kernels)
    over its rounds."""
    grouped: dict[tuple, list[tuple]] = {}
    for batch, context, label, us, ratio, kernels in rows:
        grouped.setdefault((batch, context, label), []).append((us, ratio, kernels))
    return grouped


def main() -> None:
    from blink.model import presets

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--context", default="1024", help="a list too: 1024,8192,32768")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the longest context, at least 8192")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--ms", default="1,2,4,8", help="rows for the per-projection GEMV section")
    parser.add_argument("--sections", default="gemv,step")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default="all",
                        help="GEMV tiles tried at the first and last --ms")
    parser.add_argument("--projections", default="all", help="comma-separated projections for the gemv section")
    parser.add_argument("--levers", default="all", help="';'-separated LEVERS labels for the step section")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the levers in the step section (the "
                        "summary gives each lever's median [min-max] when above 1)")
    args = parser.parse_args()
    av.chosen_names(parser, args.levers, LEVERS, "levers")
    cfg = presets.get(args.model)
    sections = args.sections.split(",")
    print(f"{torch.cuda.get_device_name()}  {args.model}  triton {triton.__version__}  torch {torch.__version__}")
    wins: dict[str, list[int]] = {name: [] for name in PROJECTIONS}
    summary = []
    if "gemv" in sections:
        ms = [int(m) for m in args.ms.split(",")]
        for name, (k, n) in sk.gemm_shapes(cfg).items():
            if args.projections != "all" and name not in args.projections.split(","):
                continue
            for m in ms:
                res = bench_projection(name, k, n, m, sweep=SWEEPS[args.sweep]() if m in (ms[0], ms[-1]) else [])
                if "today (kernels + cuBLAS)" not in res or "gemv" not in res:
                    continue  # reported as FAILED above
                new = min(v for label, v in res.items() if label.startswith("gemv"))
                best = min(res, key=res.get)
                old = res["today (kernels + cuBLAS)"]
                summary.append((f"{name} M={m}", old, res["gemv"], new, best))
                if new < old:
                    wins[name].append(m)
    contexts, max_model_len = sk.parse_contexts(args.context, args.max_model_len)
    step_rows = bench_step(args.model, [int(b) for b in args.batches.split(",")], contexts, max_model_len,
                           args.levers, args.repeats) if "step" in sections else []
    print("\nSUMMARY per projection (us per call; 'default' = GEMV with default_config, PDL off)")
    print(f"  {'what':<20} {'today':>9} {'default':>9} {'best':>9}  best variant")
    for what, old, default, best, which in summary:
        print(f"  {what:<20} {old:9.2f} {default:9.2f} {best:9.2f}  {which}")
    print("\nSUMMARY step (ms, x floor, kernels per step" + (f"; median [min-max] of {args.repeats} rounds)"
                                                            if args.repeats > 1 else ")"))
    for (batch, context, label), runs in step_summary(step_rows).items():
        at = f"ctx {context:<6} " if len(contexts) > 1 else ""
        ms = sorted(us / 1e3 for us, _, _ in runs)
        spread = f" [{ms[0]:.3f}-{ms[-1]:.3f}]" if len(ms) > 1 else ""
        ratio = statistics.median(r for _, r, _ in runs)
        print(f"  b{batch:<4} {at}{label:<10} {statistics.median(ms):8.3f} ms{spread}  {ratio:6.3f} x  "
              f"{runs[0][2]:5d} kernels")
    if summary:
        chosen = [name for name, ms_won in wins.items() if ms_won and min(ms_won) == int(args.ms.split(",")[0])]
        print(f"\nGEMV wins (projection: M where it wins): { {k: v for k, v in wins.items() if v} }")
        print(f"suggested BLINK_GEMV={','.join(chosen)}  (then the step rows decide BLINK_GEMV_MAX_M and BLINK_PDL)")
    if not (summary or step_rows):
        raise SystemExit(f"nothing ran: unknown sections {sections}")


if __name__ == "__main__":
    main()
