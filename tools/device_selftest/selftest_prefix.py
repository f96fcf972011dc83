"""The control gap with the prefix cache on (issue 16): the mixed workload behind a 2,000-token shared
prefix, run on the resident loop with the cache off and on, from the %globaltimer trace. Reported: the
gap p50/p99 and its phases over every step, and the plan phase on the steps that admitted (a prefill row:
tokens > rows), where the match runs. `python -m tools.device_selftest.gpu_selftest --prefix --skip-checks`.

Prediction (H200, tiny fp32): with the cache on, the plan phase of admitting steps within ~5 us of the
cache off (the team hashes 125 blocks in parallel; the leader mixes 125 words and walks no tokens), the
gap p50 within ~3 us of the cache off; before issue 16's change the match alone cost ~30 us per admission.
"""
from __future__ import annotations

import random

import numpy as np

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device import structs
from blink.device.engine import DeviceEngine
from blink.request import SamplingParams
from tools.device_selftest import selftest_runs as runs
from tools.device_selftest.selftest_trace import pct, phase_text, shutdown_quietly, trace_stats

PREFIX_ARGS = dict(model="tiny-llama-4k", device="cuda", dtype="float32", max_num_seqs=32, max_num_batched_tokens=512,
                   block_size=16, max_model_len=4096, num_kv_blocks=2048)


def shared_prefix_mixed(n: int, vocab: int, prefix_len: int = 2000, seed: int = 16) -> list[runs.Request]:
    """One shared prefix, then the mixed workload's suffix lengths (1 to 650 tokens) and max_tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    out = []
    for rid in range(1, n + 1):
        kind = rng.random()
        slen = rng.randint(1, 64) if kind < 0.6 else rng.randint(65, 400) if kind < 0.9 else rng.randint(401, 650)
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 96), ignore_eos=True)
        out.append((rid, prefix + [rng.randrange(3, vocab) for _ in range(slen)], params))
    return out


def admission_plan_us(trace: np.ndarray) -> tuple[float, float, int]:
    """Plan phase (ingest done -> plan done) p50/p99 in us over the steps that carried a prefill row."""
    tokens, rows = structs.trace_step_sizes(trace)
    keep = tokens > rows
    ingest, plan = (trace[:, structs.TRACE_PHASES.index(k)] for k in ("ingest", "plan"))
    plan = (plan - ingest)[keep] / 1e3
    return pct(plan, 50), pct(plan, 99), int(keep.sum())


def phase_prefix(rep, n: int = 96) -> None:
    results = {}
    for caching in (False, True):
        args = EngineArgs(**PREFIX_ARGS, enable_prefix_caching=caching)
        loaded = LoadedModel.load(args)
        work = shared_prefix_mixed(n, loaded.vocab_size)
        dev = DeviceEngine(args, loaded)
        label = f"2,000-token shared prefix, cache {'on' if caching else 'off'}"
        try:
            with runs.Watchdog(600, lambda d=dev: f"{d.stats()}"):
                runs.run_all_at_once(dev, work[:1])  # the prefix is computed (and, cache on, indexed) once
                results[caching] = runs.run_staggered(dev, work[1:], {}, seed=17)
            s = dev.stats()
            dev.loop.stop()
            trace = dev.loop.read_trace()
        finally:
            shutdown_quietly(dev)
        st = trace_stats(trace)
        p50, p99, k = admission_plan_us(trace)
        rep.time(f"{label}: control gap p50 / p99 (us)", f"{st['gap50']:.2f} / {st['gap99']:.2f} (n={st['n']})")
        rep.time(f"{label}: gap phases p50 (us)", phase_text(st))
        rep.time(f"{label}: plan phase of admitting steps p50 / p99 (us)", f"{p50:.2f} / {p99:.2f} (n={k})")
        if caching:
            queries, hits = s.prefix_cache_queries, s.prefix_cache_hits
            rep.check("shared prefix: the GPU's cache hit most prompt tokens", hits > 0.7 * queries,
                      f"{hits} of {queries} tokens")
    same = sum(results[True][r].tokens == results[False][r].tokens for r in results[True])
    rep.time("shared prefix: requests with identical tokens, cache on vs off", f"{same}/{len(results[True])}")
