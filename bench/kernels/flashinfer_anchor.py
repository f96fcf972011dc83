"""FlashInfer beside blink's kernels (issue 17's anchor): decode and prefill attention over the same paged cache,
and top-p / top-k sampling over the same logits, on the GPU.

    python -m bench.kernels.flashinfer_anchor [--sections attention,prefill,sampling] [--batches 1,8,32]
                                              [--contexts 1024,8192] [--prefill-tokens 8192,32768,2048@30720]
                                              [--rows 1,8,32] [--scenarios top_p,top_k]

Attention: our default tuning against FlashInfer's BatchDecodeWithPagedKVCacheWrapper, CUDA cores and tensor cores,
on one cache layout ([blocks, 16, Hkv, D], NHD to FlashInfer) with one block table (FlashInfer's page indices are
built from it), each timed as step_kernels times ours (caches cycled past the L2, captured, us a layer), with
its error against the torch reference. FlashInfer plans on the host before each batch shape (outside the timing).
Sampling: our sampler as the engine calls it (top-20 logprobs included, and without them) against FlashInfer's
softmax with temperature followed by its rejection sampler (top_p_sampling_from_probs / top_k_sampling_from_probs),
each captured in a CUDA graph and timed with L2 flushed (sampler.time_graph); where FlashInfer will not be
captured, its kernels' device time from the profiler (L2 warm; the row says so). Each row counts the rows whose
token lies outside the reference's keep set (expected 0).

FlashInfer is not a dependency of blink: tools/fetch_flashinfer.sh fetches flashinfer-python 0.5.3 (a JIT wheel,
slimmed to 2 MB) with apache-tvm-ffi, and builds its sampling, decode and prefill modules for sm_90 here with nvcc,
so the GPU machine compiles nothing; `bash tools/gpu_run.sh flashinfer` installs and runs them.
"""
from __future__ import annotations

import argparse

import torch
import triton

from bench.kernels import sampler as sb
from bench.kernels import step_kernels as sk
from bench.kernels.prefill_attention import causal_flops, prefill_batch
from blink.kernels import sampling
from blink.kernels.attention import paged_attention_ref, paged_attention_triton
from blink.kernels.attention_merge import split_tickets
from blink.model import presets
from blink.request import MAX_TOP_LOGPROBS

WORKSPACE_BYTES = 256 * 2**20


def paged_kv_indices(tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int):
    """FlashInfer's page description of a batch from our block tables [B, width] and lengths [B]: (indptr [B + 1],
    indices (each sequence's pages in order, concatenated), last_page_len [B]), all int32. A sequence of length L
    holds ceil(L / block_size) pages; its last holds L - (pages - 1) * block_size tokens (a full page at a
    multiple, 0 pages and a last length of 0 when L is 0)."""
    pages = (seq_lens + block_size - 1) // block_size
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=tables.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(tables.shape[1], device=tables.device)[None, :] < pages[:, None]
    indices = tables[used].to(torch.int32)  # row-major: each sequence's pages in order
    last = torch.where(pages > 0, seq_lens - (pages - 1) * block_size, torch.zeros_like(seq_lens))
    return indptr, indices, last.to(torch.int32)


def kernel_us(fn, calls: int = 20) -> float:
    """The GPU time of one eager call: its kernels' device time summed by the profiler (host gaps left out, so a
    library that cannot be captured is not charged its Python)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / calls


def time_captured(fn) -> tuple[float, str]:
    """(us, how): sampler.time_graph's captured median (L2 flushed), else the kernels' summed device time if
    capture fails (the row says which)."""
    try:
        return sb.time_graph(fn), "graph"
    except Exception as e:  # noqa: BLE001 - e.g. a library that reads host state while capturing
        print(f"    (not capturable: {type(e).__name__}: {str(e)[:120]}; kernels' device time instead)", flush=True)
        torch.cuda.synchronize()
        return kernel_us(fn), "kernels"


def bench_attention(flashinfer, cfg, context: int, batch: int) -> dict[str, float]:
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, caches, starts, lens, tables, scale, kv_bytes = sk.decode_batch(cfg, context, batch, context)
    ref = paged_attention_ref(q, *caches[0], starts, lens, tables, scale)
    print(f"attention decode: batch {batch}, context {context}, {hq}/{hkv} heads x {d}, KV {kv_bytes / 1e6:.1f} MB"
          f" a layer, {len(caches)} caches cycled", flush=True)
    tickets = split_tickets(2 * batch, hkv, "cuda")
    runs = {"blink (default tuning)": lambda kv: paged_attention_triton(q, *kv, starts, lens, tables, scale,
                                                                       split_tickets=tickets)}
    indptr, indices, last = paged_kv_indices(tables, lens, sk.BLOCK_SIZE)
    for tensor_cores in (False, True):
        label = "flashinfer decode" + (", tensor cores" if tensor_cores else "")
        try:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "NHD", use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, indices, last, hq, hkv, d, sk.BLOCK_SIZE, pos_encoding_mode="NONE",
                         q_data_type=q.dtype, kv_data_type=q.dtype, sm_scale=scale)
        except Exception as e:  # noqa: BLE001 - the plan (or a module load) failing must not cost the other rows
            print(f"  {label:<34} FAILED to plan: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        runs[label] = lambda kv, wrapper=wrapper: wrapper.run(q, kv)
    results = {}
    for label, run in runs.items():
        try:
            err = sk.rel_err(run(caches[0]), ref)
            us = sk.graph_time_us([lambda kv=kv, run=run: run(kv) for kv in caches])
        except Exception as e:  # noqa: BLE001 - one failing library path must not cost the others
            print(f"  {label:<34} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        sk.row(label, us, kv_bytes, err)
        results[label] = us
    return results


def bench_prefill(flashinfer, cfg, case: str) -> dict[str, float]:
    """One causal chunk of T tokens after C cached ("T" or "T@C") over a shuffled paged cache (prefill_attention.py's
    shape): ours (default tuning) against FlashInfer's paged prefill, fa2 and Hopper's fa3 (each where
    tools/fetch_flashinfer.sh built its module; fa3 with FI_FA3=1). err: FlashInfer's output against ours."""
    tokens, _, cached = case.partition("@")
    tokens, cached = int(tokens), int(cached or 0)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, caches, starts, lens, tables, scale, _ = prefill_batch(tokens, cached, (hq, hkv), d)
    flops = causal_flops(tokens, cached, hq, d)
    print(f"attention prefill: {tokens} tokens after {cached} cached, causal, {flops / 1e12:.2f} TFLOP", flush=True)
    indptr, indices, last = paged_kv_indices(tables, lens, sk.BLOCK_SIZE)
    runs = {"blink (default tuning)": lambda kv: paged_attention_triton(q, *kv, starts, lens, tables, scale)}
    for backend in ("fa2", "fa3"):
        try:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "NHD", backend=backend)
            wrapper.plan(starts, indptr, indices, last, hq, hkv, d, sk.BLOCK_SIZE, causal=True, sm_scale=scale,
                         q_data_type=q.dtype, kv_data_type=q.dtype)
            runs[f"flashinfer prefill ({backend})"] = lambda kv, wrapper=wrapper: wrapper.run(q, kv)
        except Exception as e:  # noqa: BLE001
            print(f"  flashinfer prefill ({backend}) FAILED to plan: {type(e).__name__}: {str(e)[:200]}", flush=True)
    results, ours = {}, None
    for label, run in runs.items():
        try:
            out = run(caches[0])
            ours = out if ours is None else ours
            us = sk.graph_time_us([lambda kv=kv, run=run: run(kv) for kv in caches], replays=10)
        except Exception as e:  # noqa: BLE001
            print(f"  {label:<34} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        print(f"  {label:<34} {us:10.1f} us {flops / us / 1e6:6.0f} TFLOP/s  err vs ours {sk.rel_err(out, ours):.1e}",
              flush=True)
        results[label] = us
    return results


def outside_keep_set(tokens: torch.Tensor, logits, slots, state) -> int:
    """Rows whose token the reference's filters would not keep (the penalized logits under the keep threshold)."""
    penalized = sampling.apply_penalties_ref(logits.cpu(), slots.cpu(), state)
    threshold = sampling.keep_thresholds(penalized, slots.cpu(), state)
    picked = penalized.gather(1, tokens.long().cpu()[:, None]).squeeze(1)
    return int((picked < threshold).sum())


def bench_sampling(flashinfer, scenario: str, rows: int) -> dict[str, float]:
    params = sb.SCENARIOS[scenario]
    logits, slots, positions, cpu_state = sb.make_batch(rows, params)
    logits, slots, positions, state = logits.cuda(), slots.cuda(), positions.cuda(), sb.to_cuda(cpu_state)
    print(f"sampling: {scenario}, {rows} rows, V = {sb.VOCAB}", flush=True)
    fs = flashinfer.sampling

    def flashinfer_sample():
        probs = fs.softmax(logits, temperature=params.temperature)
        if params.top_k:
            return fs.top_k_sampling_from_probs(probs, params.top_k)
        return fs.top_p_sampling_from_probs(probs, params.top_p)

    runs = {"blink (engine: + top-20 logprobs)": lambda: sampling.sample_triton(
                logits, slots, positions, state, MAX_TOP_LOGPROBS).token_ids,
            "blink (no logprobs)": lambda: sampling.sample_triton(logits, slots, positions, state, 0).token_ids,
            "flashinfer softmax + rejection": flashinfer_sample}
    results = {}
    for label, run in runs.items():
        try:
            outside = outside_keep_set(run(), logits, slots, cpu_state)
            us, how = time_captured(run)
        except Exception as e:  # noqa: BLE001
            print(f"  {label:<36} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        print(f"  {label:<36} {us:9.1f} us ({how})  rows outside the keep set: {outside}/{rows}", flush=True)
        results[label] = us
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="attention,prefill,sampling")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--prefill-tokens", default="8192,32768,2048@30720", help="T or T@C (T after C cached)")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--scenarios", default="top_p,top_k")
    args = parser.parse_args()
    try:
        import flashinfer
    except ImportError:
        raise SystemExit("flashinfer is not installed: bash tools/fetch_flashinfer.sh, then the GPU stage "
                         "installs it") from None
    if not torch.cuda.is_available():
        raise SystemExit("the FlashInfer anchor needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}  flashinfer {flashinfer.__version__}  triton {triton.__version__}  "
          f"torch {torch.__version__}", flush=True)
    cfg, summary = presets.get(args.model), []
    sections = args.sections.split(",")
    if "attention" in sections:
        for context in map(int, args.contexts.split(",")):
            for batch in map(int, args.batches.split(",")):
                for label, us in bench_attention(flashinfer, cfg, context, batch).items():
                    summary.append((f"attention b{batch} ctx {context}", label, us))
    if "prefill" in sections:
        for case in args.prefill_tokens.split(","):
            for label, us in bench_prefill(flashinfer, cfg, case).items():
                summary.append((f"prefill {case}", label, us))
    if "sampling" in sections:
        for scenario in args.scenarios.split(","):
            for rows in map(int, args.rows.split(",")):
                for label, us in bench_sampling(flashinfer, scenario, rows).items():
                    summary.append((f"{scenario} S={rows}", label, us))
    print("\nSUMMARY (us; ratio to blink's first row of the same case)")
    firsts = {}
    for case, label, us in summary:
        first = firsts.setdefault(case, us)
        print(f"  {case:<24} {label:<36} {us:9.1f}  {us / first:5.2f}x")


if __name__ == "__main__":
    main()
