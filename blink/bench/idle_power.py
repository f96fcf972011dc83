"""Idle power and the first request after idle (issue 19), side by side: host mode, and device mode under
each `--device-idle` policy (spin = the old 8 us backoff; deep). For each: start `blink serve`, warm it
up, let it idle, read NVML's power and utilisation for --idle-seconds, the engine process's CPU time over
that window, then the client TTFT of one streamed request after each of --probes idle periods of
--idle-before-s (and, for reference, back to back). The GPU with no server is measured first."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.host_cpu import process_cpu_seconds
from blink.bench.server_process import BlinkServer, ServeSpec

# park: accepted by the CLI since both park GPU tests passed on the H200 (session 18)
CONFIGS = {"host": ("host", None), "device-spin": ("device", "spin"), "device-deep": ("device", "deep"),
           "device-park": ("device", "park")}


def first_token_s(http: httpx.Client, base_url: str, model: str) -> float:
    """Client seconds from sending one streamed completion to its first token chunk."""
    payload = {"model": model, "prompt": "Once upon a time", "max_tokens": 4, "stream": True, "ignore_eos": True}
    start = time.perf_counter()
    with http.stream("POST", base_url + "/v1/completions", json=payload) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:") and '"text"' in line:
                return time.perf_counter() - start
    raise RuntimeError("the stream ended without a token")


def measure(name: str, spec: ServeSpec, gpu: GpuMonitor, opts) -> dict:
    with BlinkServer(spec, f"{opts.log_dir}/idle_power_{name}.log") as server, httpx.Client(timeout=120) as http:
        model = http.get(spec.base_url + "/v1/models").json()["data"][0]["id"]
        for _ in range(3):  # warm-up: graphs, allocator, the front end's pools
            first_token_s(http, spec.base_url, model)
        warm = [first_token_s(http, spec.base_url, model) for _ in range(opts.probes)]
        time.sleep(opts.settle_s)  # past every idle threshold (deep: 10 ms)
        cpu0 = process_cpu_seconds(server.engine_pid) if server.engine_pid else None
        power = gpu.idle_power(opts.idle_seconds)
        cpu = (process_cpu_seconds(server.engine_pid) - cpu0) / power["seconds"] if cpu0 is not None else None
        after_idle = []
        for _ in range(opts.probes):
            time.sleep(opts.idle_before_s)
            after_idle.append(first_token_s(http, spec.base_url, model))
    return {"config": name, "idle_mean_w": power["mean_w"], "idle_energy_mean_w": power["energy_mean_w"],
            "idle_utilization_pct": power.get("mean_utilization_pct"), "engine_cpu_cores_idle": cpu,
            "ttft_warm_ms": [t * 1e3 for t in warm], "ttft_after_idle_ms": [t * 1e3 for t in after_idle]}


def cell(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(rows: list[dict], no_server: dict) -> str:
    util = cell(no_server.get("mean_utilization_pct"))
    out = [f"GPU with no server: {cell(no_server['mean_w'])} W, utilisation {util} %",
           f"{'config':14s} {'idle W':>7s} {'energy W':>8s} {'util %':>6s} {'engine CPU':>10s} "
           f"{'TTFT warm p50 ms':>16s} {'TTFT after idle p50 / max ms':>28s}"]
    for r in rows:
        after = r["ttft_after_idle_ms"]
        out.append(f"{r['config']:14s} {cell(r['idle_mean_w']):>7s} {cell(r['idle_energy_mean_w']):>8s} "
                   f"{cell(r['idle_utilization_pct']):>6s} {cell(r['engine_cpu_cores_idle'], '{:.3f}'):>10s} "
                   f"{statistics.median(r['ttft_warm_ms']):16.2f} "
                   f"{statistics.median(after):>17.2f} / {max(after):.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3.2-1b", help="a preset, a model dir, or demo (the demo model)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of " + ", ".join(CONFIGS))
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="NVML sampling window while idle")
    ap.add_argument("--settle-s", type=float, default=2.0, help="idle before the power window")
    ap.add_argument("--idle-before-s", type=float, default=1.0, help="idle before each after-idle probe")
    ap.add_argument("--probes", type=int, default=5)
    ap.add_argument("--port", type=int, default=8021)
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--result-json", default=None)
    opts = ap.parse_args(argv)
    gpu = GpuMonitor()
    no_server = gpu.idle_power(opts.idle_seconds / 2)
    rows = []
    for name in opts.configs.split(","):
        engine, idle = CONFIGS[name]
        spec = ServeSpec(engine=engine, model=None if opts.model == "demo" else opts.model,
                         max_model_len=opts.max_model_len, port=opts.port,
                         extra_args=("--device-idle", idle) if idle else ())
        rows.append(measure(name, spec, gpu, opts))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows, no_server))
    if opts.result_json:
        with open(opts.result_json, "w") as f:
            json.dump({"model": opts.model, "no_server": no_server, "configs": rows}, f, indent=1)
    gpu.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
