"""Workloads and drivers for gpu_selftest.py: run the same requests through an engine and collect, per
request, its tokens, finish reason and logprobs, checking that its records are well formed."""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

from blink.core.interface import Engine
from blink.request import FinishReason, SamplingParams, TokenEvent


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    reason: FinishReason = FinishReason.NONE
    problems: list[str] = field(default_factory=list)

    def add(self, ev: TokenEvent) -> None:
        if self.reason != FinishReason.NONE:
            self.problems.append(f"record after the finish record: {ev}")
        if ev.token_id >= 0:
            if ev.position != len(self.tokens):
                self.problems.append(f"position {ev.position}, expected {len(self.tokens)}")
            self.tokens.append(ev.token_id)
            self.logprobs.append(ev.logprob)
            self.tops.append(list(ev.top_ids))
            self.top_logprobs.append(list(ev.top_logprobs))
        self.reason = ev.finish_reason


Request = tuple[int, list[int], SamplingParams]


def mixed_workload(n: int, seed: int, vocab: int, max_total: int, greedy: bool = True) -> list[Request]:
    """Prompt lengths from 1 to hundreds, varied max_tokens; sampled requests get seeds and the rest of
    the sampling surface (top-k/p, min-p, penalties, logit_bias, logprobs)."""
    rng = random.Random(seed)
    out = []
    for rid in range(1, n + 1):
        kind = rng.random()
        plen = rng.randint(1, 64) if kind < 0.6 else rng.randint(65, 400) if kind < 0.9 else rng.randint(401, 650)
        plen = min(plen, max_total - 2)
        max_tokens = rng.randint(1, min(96, max_total - plen))
        prompt = [rng.randrange(3, vocab) for _ in range(plen)]
        if greedy:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.5,
                                    logprobs=rng.choice([None, 0, 3]))
        else:
            params = SamplingParams(
                temperature=rng.choice([0.6, 1.0, 1.3]), top_p=rng.choice([1.0, 0.9]),
                top_k=rng.choice([0, 0, 20]), min_p=rng.choice([0.0, 0.05]), seed=rng.randrange(1 << 62),
                max_tokens=max_tokens, ignore_eos=True,
                repetition_penalty=rng.choice([1.0, 1.0, 1.2]), presence_penalty=rng.choice([0.0, 0.5]),
                frequency_penalty=rng.choice([0.0, 0.3]),
                logit_bias={rng.randrange(vocab): 5.0} if rng.random() < 0.3 else {},
                logprobs=rng.choice([None, 2]))
        out.append((rid, prompt, params))
    return out


def run_all_at_once(engine: Engine, requests: list[Request], timeout: float = 240) -> dict[int, Result]:
    results = {rid: Result() for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    deadline = time.monotonic() + timeout
    while engine.has_unfinished():
        for ev in engine.step():
            results[ev.req_id].add(ev)
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine still busy after {timeout} s: {engine.stats()}")
    return results


def run_staggered(engine: Engine, requests: list[Request], aborts: dict[int, int], seed: int,
                  timeout: float = 240) -> dict[int, Result]:
    """Submit in random small waves between steps; abort request r once it has aborts[r] tokens."""
    rng = random.Random(seed)
    results = {rid: Result() for rid, _, _ in requests}
    pending, aborted = list(requests), set()
    deadline = time.monotonic() + timeout
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 6)):
            if pending:
                rid, prompt, params = pending.pop(0)
                engine.add_request(rid, prompt, params)
                if aborts.get(rid) == 0:
                    engine.abort_request(rid)
                    aborted.add(rid)
        for ev in engine.step():
            results[ev.req_id].add(ev)
        for rid, after in aborts.items():
            r = results[rid]
            if rid not in aborted and r.reason == FinishReason.NONE and len(r.tokens) >= after > 0:
                engine.abort_request(rid)
                aborted.add(rid)
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine still busy after {timeout} s: {engine.stats()}")
    return results


def compare(reference: dict[int, Result], got: dict[int, Result], aborted: set[int], logprob_tol: float) -> list[str]:
    """Problems found: token or finish mismatches (aborted requests: a prefix and ABORT), bad records."""
    problems = []
    for rid, ref in reference.items():
        g = got[rid]
        problems += [f"request {rid}: {p}" for p in g.problems]
        if rid in aborted and g.reason == FinishReason.ABORT:
            if g.tokens != ref.tokens[:len(g.tokens)]:
                problems.append(f"request {rid} (aborted): tokens are not a prefix of the reference")
            continue
        if g.tokens != ref.tokens or g.reason != ref.reason:
            first = next((i for i, (a, b) in enumerate(zip(ref.tokens, g.tokens, strict=False)) if a != b),
                         min(len(ref.tokens), len(g.tokens)))
            problems.append(f"request {rid}: differs at output token {first} ({len(ref.tokens)} vs "
                            f"{len(g.tokens)} tokens, {ref.reason.name} vs {g.reason.name})")
        elif any(abs(a - b) > logprob_tol for a, b in zip(ref.logprobs, g.logprobs, strict=True)):
            problems.append(f"request {rid}: logprobs differ by more than {logprob_tol}")
        elif ref.tops != g.tops:
            at = next(i for i, (a, b) in enumerate(zip(ref.tops, g.tops, strict=True)) if a != b)
            problems.append(f"request {rid}: top-logprob ids differ at token {at}: {ref.tops[at]} vs {g.tops[at]}")
        elif any(abs(a - b) > logprob_tol for x, y in zip(ref.top_logprobs, g.top_logprobs, strict=True)
                 for a, b in zip(x, y, strict=True)):
            problems.append(f"request {rid}: top logprobs differ by more than {logprob_tol}")
    return problems


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Watchdog:
    """If a phase overruns, print what the engine looked like and end the process: a hung GPU loop
    would otherwise hang the whole device call."""

    def __init__(self, seconds: float, describe):
        self.timer = threading.Timer(seconds, self._fire, args=(seconds, describe))
        self.timer.daemon = True

    @staticmethod
    def _fire(seconds, describe):
        print(f"WATCHDOG: phase exceeded {seconds:.0f} s; state: {describe()}", flush=True)
        os._exit(3)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()


def interference(n_spin: int, n_thrash: int):
    """Start CPU spinners and memory thrashers (as in shared/probes/probe.py); returns a stop function."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(n_spin)]
    procs += [ctx.Process(target=_thrash, daemon=True) for _ in range(n_thrash)]
    for p in procs:
        p.start()

    def stop():
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()

    return stop


def _spin():
    x = 0
    while True:
        x += 1


def _thrash():
    import numpy as np

    a = np.ones(64 * 1024 * 1024 // 8)
    while True:
        a += 1.0
