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
from tools.device_selftest.selftest_trace import pct, shutdown_quietly

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


def phase_arrival(rep, layers: int = 4, probes: int = 40, seed: int = 19) -> None:
    args = EngineArgs(**ARRIVAL_ARGS)
    loaded = LoadedModel.load(args, num_layers=layers)
    dev = DeviceEngine(args, loaded)
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
        for rid in range(BACKGROUND):
            dev.abort_request(rid)
        while dev.has_unfinished():
            if any(ev.finish_reason == FinishReason.ERROR for ev in dev.step()):
                break
    finally:
        shutdown_quietly(dev)
    in_steps = np.array(waits) / step_s
    rep.time(f"arrival during a forward ({layers}-layer llama3-8b, batch {BACKGROUND}): TTFT p50 / p90 in steps",
             f"{pct(in_steps, 50):.2f} / {pct(in_steps, 90):.2f} (step {step_s * 1e3:.3f} ms, n={probes})")
