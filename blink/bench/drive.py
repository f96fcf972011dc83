"""Driving an in-process engine through a fixed workload (offline and barrier benchmarks share it)."""
from __future__ import annotations

import time
from collections.abc import Iterator

from blink.request import SamplingParams


def run_greedy(engine, prompts: list[list[int]], output_len: int, ids: Iterator[int],
               timeout_s: float) -> tuple[float, int]:
    """Submit every prompt (greedy, ignore EOS) and step until all finish: (wall seconds, output tokens).
    `ids` must stay unique across runs on one engine."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    live = set()
    for p in prompts:
        rid = next(ids)
        engine.add_request(rid, p, params)
        live.add(rid)
    tokens = 0
    while live:
        for e in engine.step():
            tokens += e.token_id >= 0
            if e.finished:
                live.discard(e.req_id)
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"{len(live)} requests unfinished after {timeout_s} s: {engine.stats()}")
    return time.perf_counter() - start, tokens
