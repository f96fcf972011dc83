"""Tokenization, chat templating and large detokenizations in a bounded worker pool, off the event loop.

One large request must not stall /health or open streams. HF tokenizers' `encode` holds the GIL even in
a thread, `encode_batch`/`decode_batch` release it, so the pool calls the batch forms. Chat templating is
Python (jinja2) and keeps the GIL, but in a thread the interpreter switches away every few ms, so the
loop still runs. Past `max_pending` jobs in flight the pool refuses new ones with a 503.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from blink.frontend.errors import APIError
from blink.text.prefix_tokens import PrefixTokenCache
from blink.text.tokenizer import ModelTokenizer

T = TypeVar("T")
logger = logging.getLogger(__name__)
DEFAULT_WORKERS = 2
# Running + queued jobs; one more gets a 503. A guard against a runaway client, not a load limit: vLLM and SGLang
# queue every request, and at 64 a burst of 200 requests at once saw 9 refused on an H100 host (2026-12-05).
DEFAULT_MAX_PENDING = 1024
LEARN_BELOW_PENDING = 32  # prefix learning is an optimisation: skipped while this many jobs wait
INLINE_DECODE_TOKENS = 256  # shorter decodes run on the loop: a thread hop would cost more than them
# Shorter texts are tokenized (and short chats templated) on the loop: ~0.1 ms of work at most, where the
# hop to a worker and back cost 0.1-0.2 ms of TTFT on the 2-core CPU machine (docs/perf.md, 2026-12-01).
INLINE_ENCODE_CHARS = 1024
INLINE_TAIL_CHARS = 2 * INLINE_ENCODE_CHARS  # after a prefix hit: at most a stride plus a typical new turn
WORKER_NICE = 10  # above the loop's: on a busy machine the event loop (streams, /health) gets the CPU first


class TextWorkers:
    def __init__(self, tokenizer: ModelTokenizer, workers: int = DEFAULT_WORKERS,
                 max_pending: int = DEFAULT_MAX_PENDING):
        self.tokenizer = tokenizer
        self.max_pending = max_pending
        self.pending = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="blink-text",
                                        initializer=_lower_priority)
        self.prefixes = PrefixTokenCache(tokenizer.tokenizer)  # a resent long prefix is not tokenized again

    async def run(self, fn: Callable[..., T], *args, inline: bool = False) -> T:
        """fn(*args) on a worker; 503 when `max_pending` jobs are already in flight. `inline`: a job too
        small for the hop runs here, on the loop."""
        if inline:
            return fn(*args)
        with self._lock:
            if self.pending >= self.max_pending:
                raise APIError(503, f"too many concurrent tokenizations (limit {self.max_pending}); retry later")
            self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            with self._lock:
                self.pending -= 1

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        hit = self.prefixes.lookup(text, add_special_tokens)
        if hit is None:
            ids = await self._encode(text, add_special_tokens, INLINE_ENCODE_CHARS)
        else:  # the ids of a known prefix, and the rest encoded on its own (prefix_tokens.py)
            ids = hit.prefix_ids + await self._encode(text[hit.cut:], False, INLINE_TAIL_CHARS)
        self._learn_later(text, add_special_tokens, ids, hit)
        return ids

    async def _encode(self, text: str, add_special_tokens: bool, inline_chars: int) -> list[int]:
        if len(text) <= inline_chars:
            return self.tokenizer.encode(text, add_special_tokens)
        return await self.run(self.tokenizer.encode_released, text, add_special_tokens)

    def _learn_later(self, text: str, add_special_tokens: bool, ids: list[int], hit) -> None:
        """After the request has its ids: a worker learns the text's boundaries, unless the pool is busy
        with requests (learning is an optimisation; a skipped text is learned from a later resend)."""
        if not self.prefixes.enabled or len(text) < self.prefixes.min_chars or self.pending >= LEARN_BELOW_PENDING:
            return
        self._pool.submit(_learn_quietly, self.prefixes, text, add_special_tokens, ids, hit)

    async def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) <= INLINE_DECODE_TOKENS:
            return self.tokenizer.decode(ids, skip_special_tokens)
        return await self.run(self.tokenizer.decode_released, ids, skip_special_tokens)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _learn_quietly(prefixes: PrefixTokenCache, *args) -> None:
    try:
        prefixes.learn(*args)
    except Exception:  # never fails a request (it has its ids already); the text is just not cached
        logger.exception("prefix token cache: learning a text failed")


def _lower_priority() -> None:
    """Linux: a thread is a task, so setpriority on its id renices this worker thread alone; relative to
    the niceness it inherited (the front end's, `blink serve --frontend-nice`)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WORKER_NICE))
    except (AttributeError, OSError):  # not Linux, or not permitted: same priority as the loop
        pass
