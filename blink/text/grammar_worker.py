"""Compiles in a worker process: outlines-core holds the GIL while it builds a DFA (1.8 s measured for
a bounded-string schema at 32k tokens), which in a thread would freeze the front end's event loop or
the host engine's step loop. One worker per process that asks, started on the first constraint.

A regex can ask for an exponential DFA ("(a|b)*a(a|b){30}"): the worker runs under an address-space
limit and a caller-side deadline; past either, the worker is killed and replaced, and the constraint
is refused as too complex (GrammarTooLarge), so one request cannot stall or sink the others.
"""
from __future__ import annotations

import multiprocessing
import threading
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor

from blink.grammar.schema import GrammarTooLarge
from blink.grammar.tables import GrammarTables
from blink.request import Constraint

CACHE_ENTRIES = 64
COMPILE_TIMEOUT_S = 60.0  # deadline for one compile (real schemas: p50 1.7 s, p99 132 s at 87k tokens here)
WORKER_MEMORY_BYTES = 16 << 30  # address space of a worker (an exploding DFA fails instead of swapping)
_compiler = None  # in the worker


def _init(model: str, tokenizer_dir: str | None, vocab_size: int, eos_ids: tuple[int, ...],
          arena_bytes: int) -> None:
    global _compiler
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    from blink.text.grammar_setup import build_compiler
    from blink.text.tokenizer import load_tokenizer

    _compiler = build_compiler(load_tokenizer(model, tokenizer_dir).tokenizer, vocab_size, eos_ids, arena_bytes)


def _compile(c: Constraint, want_tables: bool) -> GrammarTables | None:
    from blink.grammar.schema import GrammarError

    if _compiler is None:
        raise GrammarError("structured outputs are off on this server (--grammar-arena-mb 0)")
    tables = _compiler.compile(c)
    return tables if want_tables else None  # the front end only needs to know that it compiles


class CompilePool:
    """Compile constraints off this process's GIL; results cached here (LRU)."""

    def __init__(self, model: str, tokenizer_dir: str | None, vocab_size: int, eos_ids: tuple[int, ...],
                 arena_bytes: int):
        self._initargs = (model, tokenizer_dir, vocab_size, tuple(eos_ids), arena_bytes)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.cache: OrderedDict[Constraint, GrammarTables | None] = OrderedDict()

    @classmethod
    def for_engine(cls, args, loaded) -> CompilePool:
        """An in-process engine's pool (host mode, device mode's DeviceEngine): its model dir (the demo
        model's when none is given), vocabulary, EOS ids and grammar arena (args: EngineArgs)."""
        from blink.model.demo import ensure_default_model

        return cls(args.model or str(ensure_default_model()), args.tokenizer, loaded.vocab_size,
                   loaded.eos_token_ids, args.grammar_arena_mb << 20)

    def submit(self, c: Constraint, want_tables: bool = True) -> Future:
        """A future of the tables (None when want_tables is False); raises GrammarError through it."""
        with self._lock:
            if c in self.cache and (self.cache[c] is not None or not want_tables):
                self.cache.move_to_end(c)
                done: Future = Future()
                done.set_result(self.cache[c])
                return done
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init, initargs=self._initargs)
            future = self._pool.submit(_compile, c, want_tables)
        future.add_done_callback(lambda f: self._remember(c, f))
        return future

    def _remember(self, c: Constraint, f: Future) -> None:
        if f.cancelled() or f.exception() is not None:
            return
        with self._lock:
            self.cache[c] = f.result()
            while len(self.cache) > CACHE_ENTRIES:
                self.cache.popitem(last=False)

    def shutdown(self) -> None:
        """At exit: the worker holds nothing worth waiting for (a compile in flight would delay the exit)."""
        self.kill()

    def kill(self) -> None:
        """Terminate the worker (a compile past its deadline, or exit); the next submit starts another."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):  # the executor has no public kill
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)


def too_complex(seconds: float) -> GrammarTooLarge:
    return GrammarTooLarge(f"the constraint is too complex: compiling it took over {seconds:.0f} s or ran out "
                           "of memory")
