"""`gpu_selftest --offline-8b [--layers N]`: exactly `blink bench offline`'s device-mode run (llama3-8b preset,
bf16, random weights, 64 seqs, 2048-token budget, max_model_len 400, gpu_memory_utilization 0.6; warm-up
2 x 4 tokens, then 64 x (256 prompt, 128 output, greedy, ignore_eos), then batch 1), under deadlines, with
tok/s for both modes. Then what hung the bench: a device-wide torch.cuda.synchronize() while the
scheduler kernel is resident blocks until the loop stops; torch's own stream synchronizes fine."""
from __future__ import annotations

import gc
import threading
import time

import numpy as np
import torch

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.request import FinishReason, SamplingParams
from tools.device_selftest import selftest_runs as runs
from tools.device_selftest.selftest_trace import shutdown_quietly

OFFLINE = dict(model="llama3-8b", dtype="bfloat16", device="cuda", max_num_seqs=64, max_num_batched_tokens=2048,
               max_model_len=256 + 128 + 16, gpu_memory_utilization=0.6)
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 64, 256, 128
PHASE_DEADLINE_S = 420  # load, two captures of 12 buckets (device: x2), three runs of each mode


def offline_requests(vocab: int, first_id: int, n: int, olen: int) -> list[runs.Request]:
    """The bench's prompts (numpy default_rng(0), ids below vocab - 1000), greedy, ignore_eos."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab - 1000, INPUT_LEN).tolist() for _ in range(NUM_PROMPTS)]
    params = SamplingParams(temperature=0, max_tokens=olen, ignore_eos=True)
    return [(first_id + i, prompts[i], params) for i in range(n)]


def timed_runs(engine, vocab: int, timeout: float) -> dict[str, tuple[float, dict[int, runs.Result]]]:
    out = {}
    for name, first_id, n, olen in (("warm-up", 1, 2, 4), ("main", 101, NUM_PROMPTS, OUTPUT_LEN),
                                    ("batch 1", 201, 1, OUTPUT_LEN)):
        t = time.perf_counter()
        got = runs.run_all_at_once(engine, offline_requests(vocab, first_id, n, olen), timeout=timeout)
        out[name] = (time.perf_counter() - t, got)
    return out


def blocks_for(fn, seconds: float) -> threading.Thread | None:
    """Run fn on a daemon thread; the thread if it is still blocked after `seconds`, else None."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return t if t.is_alive() else None


def phase_offline_8b(rep, layers: int | None = None) -> None:
    args = EngineArgs(**OFFLINE)
    t = time.perf_counter()
    loaded = LoadedModel.load(args, num_layers=layers)
    kv = loaded.kv_cache
    label = f"offline llama3-8b{'' if layers is None else f' ({layers} layers)'}"
    rep.time(f"{label}: load; KV pool", f"{time.perf_counter() - t:.1f} s; {kv.num_blocks} blocks of {kv.block_size}")
    vocab, dev = loaded.vocab_size, None
    with runs.Watchdog(PHASE_DEADLINE_S, lambda: dev.segment.counters() if dev and dev.segment else "no engine"):
        host = HostEngine(args, loaded)
        ref = timed_runs(host, vocab, timeout=120)
        del host
        gc.collect()
        torch.cuda.synchronize()  # no loop resident yet: safe
        t = time.perf_counter()
        dev = DeviceEngine(args, loaded)
        rep.time(f"{label}: device engine start-up", f"{time.perf_counter() - t:.1f} s")
        hang = None
        try:
            stream_sync = blocks_for(torch.cuda.current_stream().synchronize, 10)
            rep.check(f"{label}: torch's stream synchronizes while the loop is resident (the bench's fix)",
                      stream_sync is None)
            got = timed_runs(dev, vocab, timeout=120)
            offline_checks(rep, label, ref, got)
            hang = blocks_for(torch.cuda.synchronize, 5)
            rep.check(f"{label}: torch.cuda.synchronize() blocks while the loop is resident (the bench hang)",
                      hang is not None, "blocked 5 s" if hang else "returned: the hang has another cause")
        finally:
            shutdown_quietly(dev)
        if hang is not None:
            hang.join(30)
            rep.check(f"{label}: ... and returns once the loop has stopped", not hang.is_alive())
    dev = loaded = kv = None  # free the 8B weights and pool before the next phase
    gc.collect()
    torch.cuda.empty_cache()


def offline_checks(rep, label: str, ref, got) -> None:
    for name, (dt, results) in got.items():
        olen = 4 if name == "warm-up" else OUTPUT_LEN
        tokens = sum(len(r.tokens) for r in results.values())
        ok = all(len(r.tokens) == olen and r.reason == FinishReason.LENGTH and not r.problems
                 for r in results.values())
        rep.check(f"{label}: device {name}: {len(results)} requests x {olen} tokens, LENGTH, records well formed",
                  ok, f"{tokens} tokens in {dt:.2f} s")
        ref_dt, ref_results = ref[name]
        ref_tokens = sum(len(r.tokens) for r in ref_results.values())
        same = sum(results[r].tokens == ref_results[r].tokens for r in ref_results)
        rep.time(f"{label}: {name} tok/s: device | host (requests identical)",
                 f"{tokens / dt:.0f} | {ref_tokens / ref_dt:.0f} ({same}/{len(ref_results)})")
