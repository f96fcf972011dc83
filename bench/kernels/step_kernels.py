"""Times one decode step's kernels on the GPU, variant against variant, each checked against its reference.

    .venv/bin/python bench/kernels/step_kernels.py [--model llama3-8b] [--context 1024[,8192,...]] [--batches 1,8,32]

Every time is the median over graph replays of a CUDA graph that runs the kernel on `copies` different
input sets in a row (one per layer, as in the model), divided by the number of calls: launch gaps are
those of graph replay, and the inputs cycled through exceed the 50 MB L2, so weights and KV come from HBM.
GB/s counts the bytes the kernel must move (KV read, weights read). err is the max relative error against
the torch reference (|got - ref|.max() / |ref|.max()). The summary at the end adds the per-layer numbers
up to one step of the model. Several contexts share one block-table width (--max-model-len, default the
longest context or 8192), as one captured graph serves them all.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
import triton

from bench.kernels.attention_variants import ATTENTION_VARIANTS, PREVIOUS_ATTENTION, chosen_names
from blink.kernels.activation import silu_and_mul_triton
from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_merge import split_tickets
from blink.kernels.attention_plan import launch_plan
from blink.kernels.kv_write import write_kv_triton
from blink.kernels.rmsnorm import rms_norm_triton
from blink.kernels.rope import apply_rope_triton, rope_and_write_kv_ref, rope_and_write_kv_triton

DEVICE, DTYPE = "cuda", torch.bfloat16  # the dry run on CPU (tests) swaps in cpu, float16
L2_BYTES = 50 * 2**20
BLOCK_SIZE = 16


def graph_time_us(calls: list, replays: int = 30) -> float:
    """Median per-call time of `calls` run back to back inside one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return statistics.median(times)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def copies_for(nbytes: int) -> int:
    return max(2, min(32, triton.cdiv(2 * L2_BYTES, nbytes)))


def row(name: str, us: float, nbytes: int, err: float | None, extra: str = "") -> None:
    err_text = "" if err is None else f"err {err:.1e}"
    print(f"  {name:<34} {us:9.2f} us {nbytes / us / 1e3:8.0f} GB/s  {err_text:<12} {extra}", flush=True)


def decode_batch(cfg, context: int, batch: int, max_model_len: int):
    """A decode batch over a paged cache as the runner lays it out: (q [B, Hq, D], `copies` (K, V) caches of
    [blocks, BLOCK_SIZE, Hkv, D], query starts, seq lens, block tables, scale, KV bytes a layer). The blocks are
    shuffled, as a long-running cache's are."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    blocks_per_seq, width = triton.cdiv(context, BLOCK_SIZE), triton.cdiv(max_model_len, BLOCK_SIZE)
    kv_bytes = 2 * batch * context * hkv * d * 2
    num_blocks = batch * blocks_per_seq + 1
    caches = [(torch.randn(num_blocks, BLOCK_SIZE, hkv, d, device=DEVICE, dtype=DTYPE),
               torch.randn(num_blocks, BLOCK_SIZE, hkv, d, device=DEVICE, dtype=DTYPE))
              for _ in range(copies_for(kv_bytes))]
    tables = torch.zeros(batch, width, dtype=torch.int32, device=DEVICE)
    tables[:, :blocks_per_seq] = torch.randperm(num_blocks - 1, device=DEVICE)[: batch * blocks_per_seq].view(
        batch, blocks_per_seq).int()
    q = torch.randn(batch, hq, d, device=DEVICE, dtype=DTYPE)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    return q, caches, starts, lens, tables, d**-0.5, kv_bytes


def bench_attention(cfg, context: int, batch: int, max_model_len: int, variants: dict) -> dict[str, float]:
    """Each of `variants` (name -> AttentionTuning, rows of ATTENTION_VARIANTS) alone, us a layer."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, caches, starts, lens, tables, scale, kv_bytes = decode_batch(cfg, context, batch, max_model_len)
    width = tables.shape[1]
    ref = paged_attention_ref(q, *caches[0], starts, lens, tables, scale)
    print(f"attention decode: batch {batch}, context {context}, {hq}/{hkv} heads x {d}, "
          f"KV {kv_bytes / 1e6:.1f} MB/layer, {len(caches)} caches cycled", flush=True)
    results, tickets = {}, split_tickets(2 * batch, hkv, DEVICE)  # as the runner's
    for name, tuning in variants.items():
        run = lambda kv, tuning=tuning: paged_attention_triton(q, *kv, starts, lens, tables, scale, tuning=tuning,
                                                               split_tickets=tickets)
        err = rel_err(run(caches[0]), ref)
        us = graph_time_us([lambda kv=kv, run=run: run(kv) for kv in caches])
        plan = launch_plan(batch, batch, hq, hkv, d, width * BLOCK_SIZE, tuning)
        used = f" ({plan.splits_with_work(context)} with KV)" if plan.split_min_tiles else ""
        row(name, us, kv_bytes, err, f"n{plan.block_n} splits {plan.num_splits}{used}")
        results[name] = us
    return results


def bench_small_kernels(cfg, tokens: int) -> dict[str, float]:
    """Per-layer small kernels; the fused rope+kv-write against rope then write_kv (and the q/k norms)."""
    hq, hkv, d, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=DEVICE, dtype=DTYPE)
    q, k, v = (t.view(tokens, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=1))
    caches = [torch.zeros(tokens + 8, BLOCK_SIZE, hkv, d, device=DEVICE, dtype=DTYPE) for _ in range(2)]
    slots = torch.randperm((tokens + 8) * BLOCK_SIZE, device=DEVICE)[:tokens]
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    angles = torch.rand(8192, d // 2, device=DEVICE) * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)
    norm_w = torch.randn(d, device=DEVICE, dtype=DTYPE)
    qk_norm = cfg.qk_norm
    weights = (norm_w, norm_w, cfg.rms_norm_eps) if qk_norm else (None, None, 0.0)
    results, io_bytes = {}, qkv.numel() * 2 + 2 * k.numel() * 2
    print(f"small kernels: {tokens} tokens (qk_norm={qk_norm})", flush=True)

    def unfused():
        qq, kk = (rms_norm_triton(q, norm_w, 1e-6), rms_norm_triton(k, norm_w, 1e-6)) if qk_norm else (q, k)
        apply_rope_triton(qq, kk, positions, cos_sin)
        write_kv_triton(kk, v, *caches, slots)

    fused = lambda: rope_and_write_kv_triton(q, k, v, positions, cos_sin, *caches, slots, *weights)
    split_heads = lambda t: [part.view(tokens, -1, d) for part in t.split([hq * d, hkv * d, hkv * d], dim=1)]
    expected, got = [[qkv.clone(), caches[0].clone(), caches[1].clone()] for _ in range(2)]
    rope_and_write_kv_ref(*split_heads(expected[0]), positions, cos_sin, *expected[1:], slots, *weights)
    rope_and_write_kv_triton(*split_heads(got[0]), positions, cos_sin, *got[1:], slots, *weights)
    err = max(rel_err(a, b) for a, b in zip(got, expected, strict=True))
    for name, fn, err_of in (("rope(+qk norm)+write_kv unfused", unfused, None),
                             ("rope_and_write_kv fused", fused, err)):
        us = graph_time_us([fn] * 8)
        row(name, us, io_bytes, err_of)
        results[name] = us
    x, res = (torch.randn(tokens, hidden, device=DEVICE, dtype=DTYPE) for _ in range(2))
    w = torch.ones(hidden, device=DEVICE, dtype=DTYPE)
    us = graph_time_us([lambda: rms_norm_triton(x, w, 1e-5, res)] * 8)
    row("rms_norm + residual", us, 4 * x.numel() * 2, None)
    results["rms_norm"] = us
    gate_up = torch.randn(tokens, 2 * cfg.intermediate_size, device=DEVICE, dtype=DTYPE)
    us = graph_time_us([lambda: silu_and_mul_triton(gate_up)] * 8)
    row("silu_and_mul", us, gate_up.numel() * 3, None)
    results["silu_and_mul"] = us
    return results


def gemm_shapes(cfg) -> dict[str, tuple[int, int]]:
    """name -> (K, N) of one layer's linears and the lm_head."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"qkv": (h, cfg.q_size + 2 * cfg.kv_size), "o": (cfg.q_size, h), "gate_up": (h, 2 * i),
            "down": (i, h), "lm_head": (h, cfg.vocab_size)}


def bench_gemm(name: str, k: int, n: int, m: int) -> dict[str, float]:
    """F.linear (cuBLAS) on one layer's shape; `down` also with its silu_and_mul in front."""
    gated = name == "down"
    w_bytes = n * k * 2
    weights = [torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k**0.5 for _ in range(copies_for(w_bytes))]
    x = torch.randn(m, 2 * k if gated else k, device=DEVICE, dtype=DTYPE)
    x_act = silu_and_mul_triton(x) if gated else x
    ref = F.linear(x_act.float(), weights[0].float())
    print(f"gemm {name}: M={m} K={k} N={n} ({w_bytes / 1e6:.0f} MB, {len(weights)} copies cycled)", flush=True)
    results = {}

    def measure(label, fn):
        err = rel_err(fn(weights[0]), ref)
        us = graph_time_us([lambda w=w: fn(w) for w in weights])
        row(label, us, w_bytes, err)
        results[label] = us

    measure("F.linear (cuBLAS)", lambda w: F.linear(x_act, w))
    if gated:
        measure("silu_and_mul + F.linear", lambda w: F.linear(silu_and_mul_triton(x), w))
    return results


def weight_bytes_read(model, cfg) -> int:
    """Bytes of weights a decode step reads: every parameter but the embedding (the LM head's when tied)."""
    total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)
    if cfg.tie_word_embeddings:
        total += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    return total


def decode_floor(weight_bytes: int, cfg, batch: int, context: int) -> tuple[int, float]:
    """(KV bytes, floor in us) of a decode step of `batch` sequences of `context` tokens (bf16 K and V)."""
    kv_bytes = 2 * batch * context * cfg.kv_size * 2 * cfg.num_hidden_layers
    return kv_bytes, (weight_bytes + kv_bytes) / 4.29e6  # bytes / (4.29 TB/s), in us


def bench_step(model_name: str, batches: list[int], contexts: list[int], max_model_len: int) -> list[tuple]:
    """A whole decode step (forward + logits) of the model in one CUDA graph, against its floor."""
    from blink.model.weights import load_model

    model, cfg = load_model(model_name, DEVICE, DTYPE, max_positions=max_model_len)
    weight_bytes = weight_bytes_read(model, cfg)
    rows = []
    for context, batch in ((c, b) for c in contexts for b in batches):
        at = f" ctx {context}" if len(contexts) > 1 else ""
        kv_bytes, floor_us = decode_floor(weight_bytes, cfg, batch, context)
        print(f"whole decode step: batch {batch}, context {context}: floor {floor_us:.0f} us "
              f"({weight_bytes / 1e9:.1f} GB weights + {kv_bytes / 1e9:.2f} GB KV at 4.29 TB/s)", flush=True)
        step = _decode_step(model, cfg, batch, context, max_model_len)
        with torch.inference_mode():
            step()
            us = graph_time_us([step], replays=20)
        row("cuBLAS", us, weight_bytes + kv_bytes, None, f"{us / floor_us:.3f} x floor")
        rows.append((f"step b{batch}{at} (baseline: floor)", floor_us, us, us, f"{us / floor_us:.3f} x floor"))
    return rows


def _decode_step(model, cfg, batch: int, context: int, max_model_len: int):
    """One decode token for each of `batch` sequences of `context` tokens (the last one written now)."""
    from blink.model.attention_metadata import AttentionMetadata

    blocks_per_seq, width = triton.cdiv(context, BLOCK_SIZE), triton.cdiv(max_model_len, BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq + 1
    shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    kv_caches = [(torch.randn(shape, device=DEVICE, dtype=DTYPE), torch.randn(shape, device=DEVICE, dtype=DTYPE))
                 for _ in range(cfg.num_hidden_layers)]
    tables = torch.zeros(batch, width, dtype=torch.int32, device=DEVICE)
    tables[:, :blocks_per_seq] = torch.randperm(num_blocks - 1, device=DEVICE)[: batch * blocks_per_seq].view(
        batch, blocks_per_seq).int()
    last = context - 1
    attn = AttentionMetadata(
        slot_mapping=tables[:, last // BLOCK_SIZE].long() * BLOCK_SIZE + last % BLOCK_SIZE,
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=DEVICE), block_tables=tables,
        split_tickets=split_tickets(2 * batch, cfg.num_key_value_heads, DEVICE))  # as the runner's
    input_ids = torch.randint(0, cfg.vocab_size, (batch,), device=DEVICE)
    positions = torch.full((batch,), last, dtype=torch.int64, device=DEVICE)

    def step():
        return model.compute_logits(model(input_ids, positions, attn, kv_caches))

    step.input_ids = input_ids  # tests replay a captured step on new tokens
    return step


def parse_contexts(text: str, max_model_len: int | None) -> tuple[list[int], int]:
    """("1024,8192", None) -> ([1024, 8192], 8192): the contexts, and a block-table width that holds the longest."""
    contexts = [int(c) for c in str(text).split(",")]
    width = max_model_len or max(8192, *contexts)
    assert max(contexts) <= width, f"--context {max(contexts)} exceeds --max-model-len {width}"
    return contexts, width


def main() -> None:
    from blink.model import presets

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--context", default="1024", help="KV tokens per sequence; a list: 1024,8192,32768")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="block-table width, in tokens (default: the longest context, at least 8192)")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--sections", default="attention,small,gemm,step")
    parser.add_argument("--variants", default=None,
                        help="attention variants to time, by exact name, ';'-separated as some names hold commas "
                             "(default: all)")
    args = parser.parse_args()
    chosen = chosen_names(parser, args.variants, ATTENTION_VARIANTS, "attention variants")
    variants = {name: tuning for name, tuning in ATTENTION_VARIANTS.items() if name in chosen}
    cfg = presets.get(args.model)
    batches = [int(b) for b in args.batches.split(",")]
    contexts, max_model_len = parse_contexts(args.context, args.max_model_len)
    sections = args.sections.split(",")
    layers = cfg.num_hidden_layers
    print(f"{torch.cuda.get_device_name()}  {args.model}: {layers} layers  triton {triton.__version__}\n")
    summary = []  # (what, baseline, new default, best, best variant's name), us per step
    for batch in batches:
        for context in contexts if "attention" in sections else []:
            res = bench_attention(cfg, context, batch, max_model_len, variants)
            best = min(res, key=res.get)
            at = f" ctx {context}" if len(contexts) > 1 else ""
            if PREVIOUS_ATTENTION in res and "default" in res:  # a --variants run may time neither
                summary.append((f"attention b{batch}{at} (baseline: before session 13)",
                                res[PREVIOUS_ATTENTION] * layers, res["default"] * layers, res[best] * layers, best))
        if "small" in sections:
            res = bench_small_kernels(cfg, batch)
            unfused, fused = res["rope(+qk norm)+write_kv unfused"], res["rope_and_write_kv fused"]
            summary.append((f"rope(+norm)+kv write b{batch}", unfused * layers, fused * layers,
                            min(unfused, fused) * layers, "fused" if fused < unfused else "unfused"))
        if "gemm" in sections:
            total = 0.0
            for name, (k, n) in gemm_shapes(cfg).items():
                res = bench_gemm(name, k, n, batch)
                calls = layers if name != "lm_head" else 1
                us = res["silu_and_mul + F.linear" if name == "down" else "F.linear (cuBLAS)"] * calls
                total += us
                summary.append((f"gemm {name} b{batch}", us, us, us, "cuBLAS"))
            summary.append((f"ALL GEMMs b{batch}", total, total, total, "cuBLAS"))
    if "step" in sections:
        summary += bench_step(args.model, batches, contexts, max_model_len)
    print("\nSUMMARY: us per decode step (per-layer time x layers); 'default' is what the model now uses")
    print(f"  {'what':<48} {'baseline':>9} {'default':>9} {'best':>9}  best variant")
    for what, base, default, best, which in summary:
        print(f"  {what:<48} {base:9.1f} {default:9.1f} {best:9.1f}  {which}")

if __name__ == "__main__":
    main()
