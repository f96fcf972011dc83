"""The self-test's decode timings: a fixed decode workload in host mode, then in device mode three ways side by side
in one process (the production loop, which launches the next step ahead; the synchronous loop; the loop relaunched
every step), each with its control gap and the gap's phases read from the scheduler's trace."""
from __future__ import annotations

import gc
import time

import torch

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tools.device_selftest import selftest_runs as runs
from tools.device_selftest.selftest_report import Report
from tools.device_selftest.selftest_trace import pct, phase_text, shutdown_quietly, trace_stats


def counters(engine: DeviceEngine) -> str:
    if not engine.segment:
        return "no segment"
    return f"{engine.segment.counters()}; alive={engine.loop.alive()}; {engine.loop.error()}"


def decode_workload(batch: int, steps: int, vocab: int, first_id: int) -> list[runs.Request]:
    p = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    return [(first_id + i, [(7 * i + j) % (vocab - 3) + 3 for j in range(16)], p) for i in range(batch)]


def phase_timing(rep: Report, loaded: LoadedModel, args: EngineArgs, label: str, batches=(1, 8, 32),
                 steps: int = 256, interference: bool = False) -> None:
    vocab = loaded.vocab_size
    host = HostEngine(args, loaded)
    host_ms, host_cpu = {}, {}
    for b in batches:
        for rid, prompt, params in decode_workload(b, steps, vocab, 1000 * b):
            host.add_request(rid, prompt, params)
        times, cpu0 = [], runs.cpu_seconds()
        while host.has_unfinished():
            t = time.perf_counter()
            host.step()
            times.append(time.perf_counter() - t)
        host_cpu[b] = (runs.cpu_seconds() - cpu0) / (b * steps) * 1000
        host_ms[b] = pct(times[len(times) // 4: -5], 50) * 1e3
        bucket = host.runner.bucket_for(b, b)
        g = host.runner.graphs[bucket]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100):
            g.replay()
        torch.cuda.synchronize()
        rep.time(f"{label}: host replay only, bucket {bucket} (ms/step)", f"{(time.perf_counter() - t) * 10:.3f}")
    del host
    gc.collect()
    torch.cuda.synchronize()
    # resident: the production loop (steps launched ahead when nothing changed); cold: the same without keeping the
    # check's lines in L2 while waiting (warm_ahead); sync: every step planned after
    # the last one finished (before 2026-12-04); relaunch: pattern (a), the loop tail-relaunched every step
    variants = {"resident": {}, "cold": {"warm_ahead": False}, "sync": {"launch_ahead": False},
                "relaunch": {"relaunch_each_step": True}}
    traces, dev_cpu = {}, {}
    for name, kwargs in variants.items():
        dev = DeviceEngine(args, loaded, **kwargs)
        try:
            with runs.Watchdog(240, lambda d=dev: counters(d)):
                for b in batches:
                    cpu0 = runs.cpu_seconds()
                    runs.run_all_at_once(dev, decode_workload(b, steps, vocab, 1000 * b))
                    dev_cpu[name, b] = (runs.cpu_seconds() - cpu0) / (b * steps) * 1000
                dev.loop.stop()
                traces[name] = dev.loop.read_trace()
        finally:
            shutdown_quietly(dev)
    for b in batches:
        st = {name: trace_stats(traces[name], rows=b) for name in variants}
        rep.time(f"{label}: decode ms/step, batch {b}: resident | cold | sync | relaunch | host",
                 " | ".join(f"{st[n]['period50'] / 1e3:.3f}" for n in variants) + f" | {host_ms[b]:.3f}  "
                 f"(n={st['resident']['n']})")
        rep.time(f"{label}: batch {b} control gap p50/p99 us: resident | cold | sync | relaunch",
                 " | ".join(f"{st[n]['gap50']:.2f}/{st[n]['gap99']:.2f}" for n in variants))
        for name in variants:
            rep.time(f"{label}: batch {b} {name} gap phases p50 us", phase_text(st[name]))
        rep.time(f"{label}: batch {b} host CPU s per 1k tokens: device | host",
                 f"{dev_cpu['resident', b]:.3f} | {host_cpu[b]:.3f}")
