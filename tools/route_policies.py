"""Routing policies of vllm-router on a shared-prefix workload, in front of two blink replicas.

    python tools/route_policies.py [--serve-args "--engine device"] [--gpus 0,1] [--groups 4] ...

Starts two `blink serve` replicas (one per GPU with --gpus), then for each policy a router, and sends
`groups` x `per-group` requests whose prompts share a long per-group prefix, in a shuffled order:
- sequentially, attributing each request to the replica whose generated-token counter moved, which gives
  the split and the prefix affinity (the share of each group's requests on that group's main replica:
  what a prefix cache would turn into saved prefill);
- then all at once (concurrency `--concurrency`), for the split under load and the wall time.
Prints one JSON line per policy. docs/deploy.md has the numbers and what they mean.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shlex
import subprocess
import sys
import time

import httpx

from blink.bench.router_process import Router, free_port, generated_tokens

POLICIES = {
    "round_robin": ("round_robin", ()),
    "cache_aware": ("cache_aware", ()),  # defaults: cache 0.3, balance abs 64, rel 1.5
    "cache_aware_tight": ("cache_aware", ("--balance-abs-threshold", "2", "--balance-rel-threshold", "1.2")),
    "power_of_two": ("power_of_two", ()),
}


def start_replica(serve_args: list[str], gpu: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}
    command = [sys.executable, "-m", "blink", "serve", "--port", str(port), "--served-model-name", "demo", *serve_args]
    proc = subprocess.Popen(command,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"replica {url} did not start (exit code {proc.poll()})")
        time.sleep(0.5)


def workload(groups: int, per_group: int, prefix_words: int, seed: int) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    prefixes = [" ".join(f"g{g}w{rng.randrange(1000)}" for _ in range(prefix_words)) for g in range(groups)]
    items = [(g, f"{prefixes[g]} question {i}: {rng.randrange(10**6)}")
             for g in range(groups) for i in range(per_group)]
    rng.shuffle(items)
    return items


def body(prompt: str, max_tokens: int) -> dict:
    return {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


def sequential(router: Router, replicas: list[str], items, max_tokens: int) -> dict:
    served_by: dict[int, list[int]] = collections.defaultdict(list)
    latencies = []
    with httpx.Client(timeout=300) as client:
        for group, prompt in items:
            before = [generated_tokens(u) for u in replicas]
            start = time.perf_counter()
            r = client.post(router.base_url + "/v1/completions", json=body(prompt, max_tokens))
            latencies.append(time.perf_counter() - start)
            r.raise_for_status()
            moved = [generated_tokens(u) - b for u, b in zip(replicas, before, strict=True)]
            served_by[group].append(max(range(len(replicas)), key=lambda k: moved[k]))
    split = [sum(v.count(k) for v in served_by.values()) for k in range(len(replicas))]
    affinity = sum(max(collections.Counter(v).values()) for v in served_by.values()) / len(items)
    latencies.sort()
    return {"split": split, "affinity": round(affinity, 3),
            "mean_latency_s": round(sum(latencies) / len(latencies), 4),
            "p50_latency_s": round(latencies[len(latencies) // 2], 4)}


async def concurrent(router: Router, replicas: list[str], items, max_tokens: int, concurrency: int) -> dict:
    before = [generated_tokens(u) for u in replicas]
    gate = asyncio.Semaphore(concurrency)

    async def one(client, prompt):
        async with gate:
            r = await client.post(router.base_url + "/v1/completions", json=body(prompt, max_tokens))
            r.raise_for_status()

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(one(client, p) for _, p in items))
    wall = time.perf_counter() - start
    split = [(generated_tokens(u) - b) // max_tokens for u, b in zip(replicas, before, strict=True)]
    return {"concurrent_split": split, "concurrent_wall_s": round(wall, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--serve-args", default="--max-num-seqs 16", help="flags for both replicas")
    p.add_argument("--gpus", default=None, help="one CUDA device per replica, e.g. 0,1")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--per-group", type=int, default=8)
    p.add_argument("--prefix-words", type=int, default=150)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    gpus = a.gpus.split(",") if a.gpus else [None, None]
    started = [start_replica(shlex.split(a.serve_args), g) for g in gpus]
    try:
        for proc, url in started:
            wait_healthy(url, proc)
        urls = [url for _, url in started]
        items = workload(a.groups, a.per_group, a.prefix_words, a.seed)
        for name in a.policies.split(","):
            policy, extra = POLICIES[name]
            router = Router(urls, policy, extra)
            try:
                router.wait_ready()
                result = {"policy": name, **sequential(router, urls, items, a.max_tokens),
                          **asyncio.run(concurrent(router, urls, items, a.max_tokens, a.concurrency))}
            finally:
                router.stop()
            print(json.dumps(result), flush=True)
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
