"""TTFT, in steps, of a request that arrives while forwards run (the step lost at ingest, perf.md session 6).

A background batch keeps the resident loop busy (llama3-8b's shape cut to a few layers, bf16, so that a step
is long against the host's timing); one-token probes with max_tokens=1 are submitted at random moments,
and each one's submit-to-token time is divided by the loop's median launch-to-launch step time.
`python -m tools.device_selftest.gpu_selftest --arrival --skip-checks`.

Prediction: with the ingress tail re-read while the loop waits for a forward, p50 about 1.5 steps (the
rest of the running step, then the probe's own); the stale read of before made it about 2.5. (The first
GPU run, 2026-12-01 session 7, gave 2.25 while this wait still went through step()'s backoff, whose
sleeps grow to 1 ms: the probe now spins on the egress ring instead.)
"""
from __future__ import annotations

import random
import time

import numpy as np

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.request import FinishReason, SamplingParams
from tools.device_selftest.selftest_trace import arrival_gap_text, pct, shutdown_quietly, trace_stats

ARRIVAL_ARGS = dict(model="llama3-8b", device="cuda", dtype="bfloat16", max_num_seqs=64,
                    max_num_batched_tokens=512, max_model_len=4096, num_kv_blocks=4096)
BACKGROUND, PROBE_BASE = 32, 1000


def wait_for(dev: DeviceEngine, req_id: int, timeout: float = 30.0) -> float:
    """Drain events until req_id's first token; returns the perf_counter time it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while dev.consumer.ring.used() == 0 and time.monotonic() < deadline:
            pass  # spin: step()'s own wait backs off to 1 ms sleeps, which a 1 ms step cannot be timed with
        for ev in dev.step():
            if ev.req_id == req_id and ev.token_id >= 0:
                return time.perf_counter()
    raise TimeoutError(f"probe {req_id} got no token in {timeout} s: {dev.stats()}")


def abort_all(dev: DeviceEngine, req_ids) -> None:
    """End the background requests and drain their last records (an ERROR ends the drain early)."""
    for rid in req_ids:
        dev.abort_request(rid)
    while dev.has_unfinished():
        if any(ev.finish_reason == FinishReason.ERROR for ev in dev.step()):
            break


# The loop's two ways to take in requests (issue 17's control gap, 2026-12-04): while a forward runs (the
# default), or in the gap between forwards only (the loop before; DeviceLoop's self-test hook). Both are run.
VARIANTS = (("ingest during forwards", False), ("ingest between forwards", True))


def phase_arrival(rep, layers: int = 4, probes: int = 40, seed: int = 19) -> None:
    args = EngineArgs(**ARRIVAL_ARGS)
    loaded = LoadedModel.load(args, num_layers=layers)
    for label, gap_only in VARIANTS:
        arrival_run(rep, args, loaded, label, gap_only, layers, probes, seed)


def arrival_run(rep, args, loaded, label: str, gap_only: bool, layers: int, probes: int, seed: int) -> None:
    dev = DeviceEngine(args, loaded, ingest_between_forwards=gap_only)
    rng = random.Random(seed)
    try:
        long = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)  # 32 x 1,504 tokens fit the pool
        for rid in range(BACKGROUND):
            dev.add_request(rid, [3 + rid, 7, 11, 13], long)
        waits = []
        for k in range(probes):
            time.sleep(rng.uniform(0.0, 0.003))  # a random moment inside some forward
            req_id = PROBE_BASE + k
            t0 = time.perf_counter()
            dev.add_request(req_id, [5 + k % 50], SamplingParams(temperature=0.0, max_tokens=1))
            waits.append(wait_for(dev, req_id) - t0)
        steps = [s.seconds for s in dev.step_times()]
        step_s = float(np.median(steps[-200:]))
        abort_all(dev, range(BACKGROUND))
        dev.loop.stop()
        gaps = trace_stats(dev.loop.read_trace())
    finally:
        shutdown_quietly(dev)
    in_steps = np.array(waits) / step_s
    rep.time(f"arrival during a forward ({layers}-layer llama3-8b, batch {BACKGROUND}, {label}): TTFT p50 / p90 in "
             f"steps", f"{pct(in_steps, 50):.2f} / {pct(in_steps, 90):.2f} (step {step_s * 1e3:.3f} ms, n={probes})")
    rep.time(f"arrival during a forward ({label}): control gap (us)", arrival_gap_text(gaps))


def phase_prefix_arrival(rep, probes: int = 30, seed: int = 23) -> None:
    """Issue 16's cached TTFT, on the engine alone: llama3-8b (all layers, bf16), three requests decoding
    behind a 2,000-token shared prefix, and probes with the same prefix plus 100 new tokens (max_tokens=1)
    submitted at random moments. Reported: submit-to-token ms, and the loop's launches in between (the
    control block's step count: the running step, the probe's prefill, and the launch after which its token
    is published make 2; 3 means the probe waited one step more). Control: 1-token probes, same load.
    Prediction: 2 launches for nearly every probe of both kinds; cached TTFT ~ half a decode step + the
    100@2000 step (~6.5 ms) ~ 9 ms."""
    args = EngineArgs(**{**ARRIVAL_ARGS, "max_num_batched_tokens": 2048})
    loaded = LoadedModel.load(args)
    for label, gap_only in VARIANTS:
        prefix_arrival_run(rep, args, loaded, label, gap_only, probes, seed)


def prefix_arrival_run(rep, args, loaded, label: str, gap_only: bool, probes: int, seed: int) -> None:
    dev = DeviceEngine(args, loaded, ingest_between_forwards=gap_only)
    rng = random.Random(seed)
    vocab = dev.limits.vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(2000)]
    try:
        long = SamplingParams(temperature=0.0, max_tokens=1800, ignore_eos=True)
        for rid in range(3):
            dev.add_request(rid, prefix + [rng.randrange(3, vocab) for _ in range(100)], long)
        while sum(ev.token_id >= 0 for ev in dev.step()) == 0:
            pass  # the prefix is computed (and cached) by the first background request
        for kind, make in (("cached prefix + 100", lambda: prefix + [rng.randrange(3, vocab) for _ in range(100)]),
                           ("1-token", lambda: [rng.randrange(3, vocab)])):
            waits, launches = [], []
            for k in range(probes):
                time.sleep(rng.uniform(0.0, 0.006))
                req_id = PROBE_BASE + (0 if kind == "1-token" else 1000) + k
                prompt = make()
                s0, t0 = dev.stats().steps, time.perf_counter()
                dev.add_request(req_id, prompt, SamplingParams(temperature=0.0, max_tokens=1))
                waits.append(wait_for(dev, req_id) - t0)
                launches.append(dev.stats().steps - s0)
            counts = {n: launches.count(n) for n in sorted(set(launches))}
            rep.time(f"prefix arrival, {kind} probes (llama3-8b, 3 decoding, {label}): submit-to-token ms p50 / p90; "
                     "launches in between", f"{pct(np.array(waits) * 1e3, 50):.2f} / "
                     f"{pct(np.array(waits) * 1e3, 90):.2f}; {counts} (n={probes})")
        steps = [s.seconds for s in dev.step_times()]
        rep.time(f"prefix arrival ({label}): launch-to-launch ms p50 (decode) / max (prefill steps)",
                 f"{np.median(steps) * 1e3:.3f} / {max(steps) * 1e3:.3f}")
        abort_all(dev, range(3))
        dev.loop.stop()
        rep.time(f"prefix arrival ({label}): control gap (us)", arrival_gap_text(trace_stats(dev.loop.read_trace())))
    finally:
        shutdown_quietly(dev)
