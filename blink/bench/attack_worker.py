"""One interference process (run as `python -m blink.bench.attack_worker`), started by attackers.py.

It sets itself up (imports, buffers, tokenizer), prints `ready`, works for `--seconds` or until
SIGTERM/SIGINT, then prints one JSON line (what it did) and exits 0.
It dies with its parent (PR_SET_PDEATHSIG) and never opens a socket.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from blink.bench.sched_knobs import POLICIES, apply_in_worker
from blink.util.processes import StopSignals, die_with_parent

# What one short-lived "compile" process does: die with its driver, then compress half a MiB with bz2
# (the paper's pbzip2 job in miniature; ~0.1 s of CPU, plus the interpreter's start-up, like a cc1 run).
COMPILE_JOB = (
    "import ctypes, os, bz2\n"
    "ctypes.CDLL(None).prctl(1, 9)\n"
    "bz2.compress(os.urandom(1 << 19), 9)\n"
)


def spin(_args):
    def work(stop: StopSignals, deadline: float) -> dict:
        iterations, x = 0, 1.0
        while not stop.requested and time.monotonic() < deadline:
            for _ in range(20_000):
                x = x * 1.0000001 + 1e-9
            iterations += 1
        return {"iterations": iterations}

    return work


def memory(args):
    """Stream copies between two buffers each larger than the LLC: every pass evicts the whole cache."""
    import numpy as np

    elements = max(1, args.buffer_mib * (1 << 20) // 2 // 8)
    buffers = [np.ones(elements, dtype=np.float64), np.ones(elements, dtype=np.float64)]  # touched now

    def work(stop: StopSignals, deadline: float) -> dict:
        passes = 0
        while not stop.requested and time.monotonic() < deadline:
            np.copyto(buffers[passes % 2], buffers[(passes + 1) % 2])
            passes += 1
        return {"iterations": passes, "bytes_streamed": passes * 2 * buffers[0].nbytes}

    return work


def compile_like(_args):
    """One short-lived CPU-bound child after another, as one `make -j` slot does."""
    def work(stop: StopSignals, deadline: float) -> dict:
        jobs = 0
        while not stop.requested and time.monotonic() < deadline:
            child = subprocess.Popen([sys.executable, "-S", "-c", COMPILE_JOB], stdin=subprocess.DEVNULL)
            while child.poll() is None:
                if stop.requested or time.monotonic() >= deadline:
                    child.kill()
                    child.wait()
                    return {"iterations": jobs}
                time.sleep(0.005)
            jobs += 1
        return {"iterations": jobs}

    return work


def load_tokenizer(path: str | None):
    """The given tokenizer.json (or a dir holding one); without one, a small BPE trained on the spot."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if path:
        return Tokenizer.from_file(os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path)
    from blink.bench.token_codec import synthetic_text

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.train_from_iterator(synthetic_text(seed=1, num_words=4000).split("\n"), trainer)
    return tokenizer


def tokenize(args):
    """Tokenize a long prompt again and again, as a front end under a flood of long requests does."""
    from blink.bench.token_codec import synthetic_text

    tokenizer = load_tokenizer(args.tokenizer)
    prompt = synthetic_text(seed=2, num_words=args.prompt_words)

    def work(stop: StopSignals, deadline: float) -> dict:
        encodes, tokens = 0, 0
        while not stop.requested and time.monotonic() < deadline:
            tokens += len(tokenizer.encode(prompt).ids)
            encodes += 1
        return {"iterations": encodes, "tokens": tokens}

    return work


# kind -> set-up (imports, buffers, tokenizer), which returns the work loop run until the deadline.
KINDS = {"spin": spin, "memory": memory, "compile": compile_like, "tokenize": tokenize}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=sorted(KINDS), required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--buffer-mib", type=int, default=256)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--prompt-words", type=int, default=4000)
    p.add_argument("--nice", type=int, default=None, help="add this to the worker's niceness")
    p.add_argument("--sched", choices=sorted(POLICIES), default=None, help="scheduling policy")
    p.add_argument("--cgroup", default=None, help="a cgroup directory to join (its weight is set there)")
    args = p.parse_args(argv)
    die_with_parent(args.parent_pid, exit_code=0)
    stop = StopSignals()
    stop.install()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    knobs = apply_in_worker(args.nice, args.sched, args.cgroup)  # before set-up, so children inherit it
    work = KINDS[args.kind](args)
    print("ready", flush=True)
    started = time.monotonic()
    report = work(stop, started + args.seconds)
    report.update(knobs, kind=args.kind, cpu=args.cpu, pid=os.getpid(), seconds=time.monotonic() - started,
                  stopped_by_signal=stop.requested)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
