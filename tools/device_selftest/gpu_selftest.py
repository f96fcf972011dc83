"""Device mode, end to end on a GPU, in one call: `python -m tools.device_selftest.gpu_selftest [--interference]
[--llama3-8b] [--offline-8b] [--prefix] [--arrival] [--layers N]` (--offline-8b: `blink bench offline`'s run,
selftest_offline.py; --prefix: the control gap behind a 2,000-token shared prefix, selftest_prefix.py;
--arrival: TTFT in steps of requests that arrive while forwards run, selftest_arrival.py).

Checks (each prints PASS/FAIL with the reason): greedy parity with host mode on a mixed, staggered workload
with aborts and a KV pool small enough to preempt; seeded sampling parity (penalties, logit_bias, top-k/p,
min-p, logprobs); 10,000 short requests through a ring that stays full (nothing lost, duplicated or
reordered); invalid descriptors and a failing device launch (request fails with ERROR, engine stays up);
idle heartbeat; clean shutdown. Timings: control gap p50/p99 from the %globaltimer trace, decode step
time at batch 1/8/32 in both modes, host CPU seconds per 1k tokens. Exit status 1 if any check failed.
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import traceback

import torch

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.request import FinishReason, SamplingParams
from tools.device_selftest import selftest_runs as runs
from tools.device_selftest.selftest_arrival import phase_arrival, phase_prefix_arrival
from tools.device_selftest.selftest_offline import phase_offline_8b
from tools.device_selftest.selftest_prefix import phase_prefix
from tools.device_selftest.selftest_report import Report
from tools.device_selftest.selftest_timing import counters, phase_timing
from tools.device_selftest.selftest_trace import context_healthy, phase_text, shutdown_quietly, trace_stats

TINY = dict(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=32, max_num_batched_tokens=128,
            block_size=16, max_model_len=1024)


def check_clean(rep: Report, name: str, engine) -> None:
    s = engine.stats()
    rep.check(name, s.running == 0 and s.waiting == 0 and s.free_kv_blocks == s.total_kv_blocks, str(s))


def phase_parity(rep: Report, loaded: LoadedModel, args: EngineArgs) -> None:
    vocab, max_total = loaded.vocab_size, loaded.kv_cache.num_blocks * args.block_size
    greedy = runs.mixed_workload(220, 1, vocab, max_total)
    seeded = [(rid + 10_000, p, sp) for rid, p, sp in runs.mixed_workload(60, 2, vocab, max_total, greedy=False)]
    rng = random.Random(3)
    stress = [(20_000 + i, [rng.randrange(3, vocab) for _ in range(rng.randint(1, 8))],
               SamplingParams(temperature=0, max_tokens=rng.randint(1, 3))) for i in range(10_000)]
    host = HostEngine(args, loaded)
    t = time.perf_counter()
    ref, ref_seeded, ref_stress = (runs.run_all_at_once(host, w) for w in (greedy, seeded, stress))
    rep.time("host mode: reference runs (greedy 220, seeded 60, 10k short)", f"{time.perf_counter() - t:.1f} s")
    del host
    gc.collect()
    torch.cuda.synchronize()

    t = time.perf_counter()
    dev = DeviceEngine(args, loaded)
    rep.time("device engine start-up (capture x2, instantiate, launch)", f"{time.perf_counter() - t:.1f} s")
    try:
        parity_checks(rep, dev, loaded, greedy, seeded, stress, ref, ref_seeded, ref_stress, rng)
    finally:
        shutdown_quietly(dev)


def parity_checks(rep, dev, loaded, greedy, seeded, stress, ref, ref_seeded, ref_stress, rng) -> None:
    with runs.Watchdog(300, lambda: counters(dev)):
        aborts = {rid: rng.choice([0, 1, 3, 10]) for rid in rng.sample([r for r, _, _ in greedy], 25)}
        got = runs.run_staggered(dev, greedy, aborts, seed=4)
        problems = runs.compare(ref, got, set(aborts), logprob_tol=1e-3)
        rep.check("greedy parity, 220 mixed requests, staggered, 25 aborts", not problems,
                  f"{len(problems)} problems; first: {problems[:3]}")
        rep.check("aborted requests end with ABORT", all(got[r].reason in (FinishReason.ABORT, ref[r].reason)
                                                         for r in aborts))
        pre = dev.stats().preemptions
        rep.check("the small KV pool forced preemption (recompute)", pre > 0, f"{pre} preemptions")
        got_seeded = runs.run_all_at_once(dev, seeded)
        problems = runs.compare(ref_seeded, got_seeded, set(), logprob_tol=1e-3)
        rep.check("seeded sampling parity, 60 requests (penalties, bias, top-k/p)", not problems,
                  f"{len(problems)} problems; first: {problems[:3]}")
        t = time.perf_counter()
        got_stress = runs.run_all_at_once(dev, stress)
        took = time.perf_counter() - t
        problems = runs.compare(ref_stress, got_stress, set(), logprob_tol=1e-3)
        rep.check("10,000 short requests, ring full: none lost/duplicated/reordered", not problems,
                  f"{len(problems)} problems; first: {problems[:3]}")
        rep.time("device mode: 10,000 short requests", f"{took:.2f} s")
        check_clean(rep, "counters after the runs: nothing running, every block free", dev)
        phase_invalid_descriptors(rep, dev, loaded)
        hb = dev.segment.control.heartbeat
        time.sleep(0.05)
        rep.check("idle: heartbeat keeps moving", dev.segment.control.heartbeat > hb)
        dev.loop.stop()
        rep.check("stop_flag: the loop finished and exited", bool(dev.segment.control.exited))
        st = trace_stats(dev.loop.read_trace())
        rep.time("mixed workload: control gap p50 / p99 (us)", f"{st['gap50']:.2f} / {st['gap99']:.2f} (n={st['n']})")
        rep.time("mixed workload: gap phases p50 (us)", phase_text(st))


def phase_invalid_descriptors(rep: Report, dev: DeviceEngine, loaded: LoadedModel) -> None:
    """Descriptors the engine must refuse, sent straight to the ring (past validate_prompt)."""
    too_long = [5] * loaded.max_model_len
    dev.producer.submit(90_001, too_long, SamplingParams(max_tokens=2))
    dev.producer.submit(90_002, [5, loaded.vocab_size + 7], SamplingParams(max_tokens=2))
    dev.add_request(90_003, [5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    seen: dict[int, runs.Result] = {r: runs.Result() for r in (90_001, 90_002, 90_003)}
    deadline = time.monotonic() + 30
    while any(r.reason == FinishReason.NONE for r in seen.values()) and time.monotonic() < deadline:
        for ev in dev.step():
            if ev.req_id in seen:
                seen[ev.req_id].add(ev)
    ok = all(seen[r].reason == FinishReason.ERROR and not seen[r].tokens for r in (90_001, 90_002))
    rep.check("invalid descriptors -> ERROR record, error_code set", ok and dev.segment.control.error_code == 1,
              f"{[(r, s.reason.name) for r, s in seen.items()]}, error_code={dev.segment.control.error_code}")
    rep.check("engine stays up after refusals", seen[90_003].reason == FinishReason.LENGTH
              and len(seen[90_003].tokens) == 3)
    dev.segment.control.error_code = 0


def phase_launch_error(rep: Report, loaded: LoadedModel, args: EngineArgs) -> None:
    """The largest bucket instantiated without the device-launch flag: its launches must fail (a long
    prompt's first chunk needs it), while steps in the other buckets go on."""
    dev = DeviceEngine(args, loaded, bad_bucket=-1)
    try:
        launch_error_checks(rep, dev, args)
    finally:
        shutdown_quietly(dev)


def launch_error_checks(rep: Report, dev: DeviceEngine, args: EngineArgs) -> None:
    with runs.Watchdog(90, lambda: counters(dev)):
        long_prompt = [5 + i % 100 for i in range(args.max_num_batched_tokens)]
        solo = runs.run_all_at_once(dev, [(1, long_prompt, SamplingParams(temperature=0, max_tokens=4))])[1]
        code = dev.segment.control.error_code
        rep.check("device launch error -> request fails with ERROR, code surfaced",
                  solo.reason == FinishReason.ERROR and code >= 1000,
                  f"{solo.reason.name} after {len(solo.tokens)} tokens; {dev.loop.error()}")
        pair = runs.run_all_at_once(dev, [(2, [5, 6], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)),
                                          (3, [7, 8], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))])
        rep.check("engine stays up after a launch error", all(len(r.tokens) == 4 for r in pair.values()),
                  str({k: (v.reason.name, len(v.tokens)) for k, v in pair.items()}))
        dev.loop.stop()
        rep.check("loop exits cleanly after a launch error", bool(dev.segment.control.exited), dev.loop.error())


def phase_llama3_8b(rep: Report, layers: int | None, under_load: bool = False) -> None:
    args = EngineArgs(model="llama3-8b", device="cuda", dtype="bfloat16", max_num_seqs=32,
                      max_num_batched_tokens=512, max_model_len=2048, num_kv_blocks=4096)
    loaded = LoadedModel.load(args, num_layers=layers)
    label = f"llama3-8b{'' if layers is None else f' ({layers} layers)'} bf16"
    work = runs.mixed_workload(64, 7, loaded.vocab_size, 1500)
    ref = runs.run_all_at_once(HostEngine(args, loaded), work)
    dev = DeviceEngine(args, loaded)
    try:
        with runs.Watchdog(900, lambda: counters(dev)):
            got = runs.run_all_at_once(dev, work)
    finally:
        shutdown_quietly(dev)
    same = sum(got[r].tokens == ref[r].tokens for r in ref)
    rep.time(f"{label}: requests identical between modes", f"{same}/{len(ref)}")
    phase_timing(rep, loaded, args, label, steps=128)
    if under_load:  # every core busy: 16 spinners + 4 memory thrashers, as in the probe
        stop = runs.interference(16, 4)
        try:
            phase_timing(rep, loaded, args, label + " + CPU load", steps=128)
        finally:
            stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interference", action="store_true", help="repeat the timings under CPU load")
    ap.add_argument("--llama3-8b", action="store_true", help="also the bf16 llama3-8b shape")
    ap.add_argument("--offline-8b", action="store_true", help="first, `blink bench offline`'s device run")
    ap.add_argument("--prefix", action="store_true", help="the control gap behind a 2,000-token shared prefix")
    ap.add_argument("--arrival", action="store_true", help="TTFT in steps of requests arriving mid-forward")
    ap.add_argument("--prefix-arrival", action="store_true", help="cached-prefix probes' TTFT and launches (llama3-8b)")
    ap.add_argument("--layers", type=int, default=None, help="cut llama3-8b to this many layers")
    ap.add_argument("--skip-checks", action="store_true", help="timings only")
    opts = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rep = Report()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    t = time.perf_counter()
    from blink.device.build import load_device_library

    load_device_library()
    rep.time("build (or cache hit) of libblink_control.so", f"{time.perf_counter() - t:.1f} s")
    phases = [lambda: phase_offline_8b(rep, opts.layers)] if opts.offline_8b else []
    if not opts.skip_checks:
        small = EngineArgs(**TINY, num_kv_blocks=48)
        loaded = LoadedModel.load(small)
        phases.append(lambda: phase_parity(rep, loaded, small))
    big = EngineArgs(**TINY, num_kv_blocks=1024)
    # a probe's call need not pay the tiny timings
    probes_only = opts.skip_checks and (opts.prefix or opts.arrival or opts.prefix_arrival)
    if not probes_only:
        phases.append(lambda: phase_timing(rep, LoadedModel.load(big), big, "tiny fp32"))
    if opts.interference:
        def loaded_phase():
            stop = runs.interference(16, 4)
            try:
                phase_timing(rep, LoadedModel.load(big), big, "tiny fp32 + CPU load", batches=(1, 8))
            finally:
                stop()
        phases.append(loaded_phase)
    if opts.llama3_8b:
        phases.append(lambda: phase_llama3_8b(rep, opts.layers, opts.interference))
    if opts.prefix:
        phases.append(lambda: phase_prefix(rep))
    if opts.arrival:
        phases.append(lambda: phase_arrival(rep))
    if opts.prefix_arrival:
        phases.append(lambda: phase_prefix_arrival(rep))
    if not opts.skip_checks:
        phases.append(lambda: phase_launch_error(rep, loaded, small))
    for phase in phases:
        try:
            phase()
        except Exception as e:  # one phase failing must not hide what the others show
            traceback.print_exc()
            rep.check("phase raised", False, f"{type(e).__name__}: {e}")
        broken = context_healthy()
        if broken is not None:  # a fault poisons the context: later phases would only report noise
            rep.check("CUDA context still usable after the phase", False, f"{broken}; later phases skipped")
            break
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
