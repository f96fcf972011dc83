"""The ingress and egress rings over a `Segment`: single producer / single consumer each, never lossy.

Counters are 64-bit and only grow; the slot of counter c is c % capacity. The producer owns `tail`, the
consumer owns `head`; a full ring means the producer waits (backpressure), nothing is ever overwritten.

Ordering: the producer writes the payload, then stores the tail; the consumer loads the tail, then reads
the payload, then stores the head. Every store and load below is its own numpy call (an opaque C call,
so the compiler cannot move one across another), counters are aligned 8-byte words (single-copy atomic)
and x86-64 keeps store->store and load->load order, which gives release/acquire for these plain accesses.
The GPU side of the same protocol must use st.release.sys / ld.acquire.sys (see csrc/layout.h).
All state lives in the segment, so either side may be a different process, a new object, or the GPU.
Each side is single-threaded by contract: one producer and one consumer object per ring, whose calls
never overlap (an asyncio front end should submit with timeout=0 and retry, not block its loop).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from blink.request import (
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    SEED_BITS,
    FinishReason,
    SamplingParams,
    TokenEvent,
    request_seed,
)
from blink.transport.layout import (
    FLAG_IGNORE_EOS,
    KIND_ABORT,
    KIND_REQUEST,
    RequestDescriptor,
    TokenRecord,
)
from blink.transport.shm import HEAD_INDEX, TAIL_INDEX, Segment

DESCRIPTOR_DTYPE = np.dtype(RequestDescriptor)
TOKEN_DTYPE = np.dtype(TokenRecord)
SPIN_S = 50e-6  # busy-poll this long before sleeping: catches a reply that is already on its way
FIRST_SLEEP_S = 20e-6
MAX_SLEEP_S = 1e-3  # the idle cost is then ~1k wake-ups/s, far from a busy core
FINISH_REASONS = {int(reason): reason for reason in FinishReason}  # FinishReason(x) is slow per token


def wait_for(ready: Callable[[], bool], timeout: float | None) -> bool:
    """Poll `ready` until it is true (True) or `timeout` seconds pass (False); None waits forever.

    Spins ~50 us, then sleeps 20 us doubling to 1 ms, so a waiting reader never burns a core.
    """
    if ready():
        return True
    if timeout is not None and timeout <= 0:
        return False
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    sleep = FIRST_SLEEP_S
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return ready()
        if now - start >= SPIN_S:
            time.sleep(sleep if deadline is None else min(sleep, deadline - now))
            sleep = min(sleep * 2, MAX_SLEEP_S)
        if ready():
            return True


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


class _Ring:
    """One ring's header words and record array, seen from either side."""

    def __init__(self, seg: Segment, header_offset: int, records: np.ndarray):
        self.words = seg.ring_header(header_offset)
        self.records = records
        self.capacity = len(records)

    @property
    def tail(self) -> int:
        return int(self.words[TAIL_INDEX])

    @property
    def head(self) -> int:
        return int(self.words[HEAD_INDEX])

    def free(self) -> int:
        return self.capacity - (self.tail - self.head)

    def used(self) -> int:
        return self.tail - self.head

    def write(self, counter: int, items: np.ndarray) -> None:
        """Copy `items` into the slots starting at `counter`, wrapping at the end of the array."""
        start = counter % self.capacity
        first = min(len(items), self.capacity - start)
        self.records[start:start + first] = items[:first]
        self.records[:len(items) - first] = items[first:]

    def read(self, counter: int, count: int) -> np.ndarray:
        """A private copy of `count` slots starting at `counter`, unwrapped."""
        start = counter % self.capacity
        first = min(count, self.capacity - start)
        if first == count:
            return self.records[start:start + count].copy()
        return np.concatenate([self.records[start:], self.records[:count - first]])


def _ingress_rings(seg: Segment) -> tuple[_Ring, _Ring]:
    layout = seg.layout
    descriptors = seg.array(DESCRIPTOR_DTYPE, layout.ingress_capacity, layout.ingress_records)
    arena = seg.array(np.int32, layout.arena_capacity, layout.arena_data)
    return _Ring(seg, layout.ingress_header, descriptors), _Ring(seg, layout.arena_header, arena)


def _egress_ring(seg: Segment) -> _Ring:
    layout = seg.layout
    records = seg.array(TOKEN_DTYPE, layout.egress_capacity, layout.egress_records)
    return _Ring(seg, layout.egress_header, records)


@dataclass
class IngressItem:
    kind: str  # "request" | "abort"
    req_id: int
    prompt_ids: list[int]
    params: SamplingParams | None  # None for an abort


class IngressProducer:
    """Front-end side of the ingress ring: requests (prompt + logit_bias in the arena) and aborts."""

    def __init__(self, seg: Segment, base_seed: int | None = None):
        """base_seed: what seeds of requests without one derive from (blink.request.request_seed); None = one
        drawn now (the server: unseeded requests are random), the engine's --seed for reproducible runs."""
        self.descriptors, self.arena = _ingress_rings(seg)
        self.base_seed = random.SystemRandom().getrandbits(SEED_BITS) if base_seed is None else base_seed

    def submit(self, req_id: int, prompt_ids: list[int], params: SamplingParams,
               timeout: float | None = None) -> bool:
        """Enqueue a request; False if the ring or the arena stayed full for `timeout` seconds.

        Raises ValueError for what can never be sent (too long for the arena, values out of range).
        """
        params.validate()  # the fields may have changed since construction; the engine gets only valid ones
        payload = self._payload(prompt_ids, params)
        if len(payload) > self.arena.capacity:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens (+{len(params.logit_bias)} logit_bias "
                             f"entries) does not fit the ingress arena ({self.arena.capacity} int32 slots)")
        record = self._descriptor(req_id, prompt_ids, params, len(payload))

        def has_room() -> bool:
            return self.descriptors.free() > 0 and self.arena.free() >= len(payload)

        if not wait_for(has_room, timeout):
            return False
        arena_tail = self.arena.tail
        self.arena.write(arena_tail, payload)
        self.arena.words[TAIL_INDEX] = arena_tail + len(payload)
        record["arena_offset"] = arena_tail
        self._publish(record)
        return True

    def abort(self, req_id: int, timeout: float | None = None) -> bool:
        """Enqueue an abort record; False if the ring stayed full for `timeout` seconds."""
        record = np.zeros(1, DESCRIPTOR_DTYPE)
        record["kind"] = KIND_ABORT
        record["req_id"] = _checked(req_id, np.uint64, "req_id")
        if not wait_for(lambda: self.descriptors.free() > 0, timeout):
            return False
        self._publish(record)
        return True

    def _publish(self, record: np.ndarray) -> None:
        tail = self.descriptors.tail
        self.descriptors.write(tail, record)
        self.descriptors.words[TAIL_INDEX] = tail + 1  # after the payload: this store publishes it

    @staticmethod
    def _payload(prompt_ids: list[int], params: SamplingParams) -> np.ndarray:
        """prompt ids, then logit_bias token ids, then logit_bias values as float32 bits."""
        prompt = _checked(prompt_ids, np.int32, "prompt token id")
        bias_ids = _checked(list(params.logit_bias.keys()), np.int32, "logit_bias token id")
        bias_values = np.asarray(list(params.logit_bias.values()), np.float32).view(np.int32)
        return np.concatenate([prompt, bias_ids, bias_values]).astype(np.int32, copy=False)

    def _descriptor(self, req_id: int, prompt_ids: list[int], params: SamplingParams,
                    arena_len: int) -> np.ndarray:
        if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are supported")
        seed = request_seed(params, req_id, self.base_seed)
        fields = {
            "kind": KIND_REQUEST, "num_stop_ids": len(params.stop_token_ids), "req_id": req_id,
            "prompt_len": len(prompt_ids), "num_logit_bias": len(params.logit_bias), "arena_len": arena_len,
            "max_tokens": params.max_tokens, "min_tokens": params.min_tokens,
            "flags": FLAG_IGNORE_EOS if params.ignore_eos else 0,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "min_p": params.min_p, "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "repetition_penalty": params.repetition_penalty,
            "num_logprobs": -1 if params.logprobs is None else params.logprobs,
            "seed": seed % (1 << 64),  # the engine keys its RNG on these 64 bits
        }
        stop_ids = np.zeros(MAX_STOP_TOKEN_IDS, np.int32)
        stop_ids[:len(params.stop_token_ids)] = _checked(params.stop_token_ids, np.int32, "stop token id")
        fields["stop_token_ids"] = stop_ids
        record = np.zeros(1, DESCRIPTOR_DTYPE)
        try:
            record[0] = tuple(fields.get(name, 0) for name in DESCRIPTOR_DTYPE.names)
        except OverflowError:  # find the culprit for the message
            for name, value in fields.items():
                _checked(value, DESCRIPTOR_DTYPE[name], name)
            raise
        if record["top_p"][0] <= 0 or record["repetition_penalty"][0] <= 0:
            raise ValueError("top_p and repetition_penalty must stay > 0 in float32")
        return record


class IngressConsumer:
    """Engine side of the ingress ring (host mode; the device engine reads the same bytes on the GPU)."""

    def __init__(self, seg: Segment):
        self.descriptors, self.arena = _ingress_rings(seg)

    def poll(self, max_items: int = 1 << 30) -> list[IngressItem]:
        """Take up to `max_items` records without waiting (possibly none)."""
        head = self.descriptors.head
        count = min(self.descriptors.tail - head, max_items)
        if count <= 0:
            return []
        items, arena_end = [], None
        # One tolist() turns the records into plain tuples: far cheaper than field access per record.
        for values in self.descriptors.read(head, count).tolist():
            record = dict(zip(DESCRIPTOR_DTYPE.names, values, strict=True))
            if record["kind"] == KIND_ABORT:
                items.append(IngressItem("abort", record["req_id"], [], None))
                continue
            offset, length = record["arena_offset"], record["arena_len"]
            items.append(_decode_request(record, self.arena.read(offset, length)))
            arena_end = offset + length
        if arena_end is not None:  # the arena is filled in request order, so this frees all copied prompts
            self.arena.words[HEAD_INDEX] = arena_end
        self.descriptors.words[HEAD_INDEX] = head + count
        return items

    def wait(self, timeout: float | None, max_items: int = 1 << 30) -> list[IngressItem]:
        """Like poll, but first waits (backing off) up to `timeout` seconds for at least one record."""
        wait_for(lambda: self.descriptors.used() > 0, timeout)
        return self.poll(max_items)


def _decode_request(record: dict, payload: np.ndarray) -> IngressItem:
    prompt_len, num_bias = record["prompt_len"], record["num_logit_bias"]
    bias_ids = payload[prompt_len:prompt_len + num_bias].tolist()
    bias_values = payload[prompt_len + num_bias:prompt_len + 2 * num_bias].view(np.float32).tolist()
    params = SamplingParams(
        temperature=record["temperature"], top_p=record["top_p"], top_k=record["top_k"],
        min_p=record["min_p"], presence_penalty=record["presence_penalty"],
        frequency_penalty=record["frequency_penalty"], repetition_penalty=record["repetition_penalty"],
        logit_bias=dict(zip(bias_ids, bias_values, strict=True)), seed=record["seed"],
        max_tokens=record["max_tokens"], min_tokens=record["min_tokens"],
        stop_token_ids=record["stop_token_ids"][:record["num_stop_ids"]].tolist(),
        ignore_eos=bool(record["flags"] & FLAG_IGNORE_EOS),
        logprobs=None if record["num_logprobs"] < 0 else record["num_logprobs"],
    )
    return IngressItem("request", record["req_id"], payload[:prompt_len].tolist(), params)


class EgressProducer:
    """Engine side of the egress ring (host mode): token records, in order, blocking while full."""

    def __init__(self, seg: Segment):
        self.ring = _egress_ring(seg)

    def push(self, events: list[TokenEvent], timeout: float | None = None) -> int:
        """Write `events` in order; returns how many went in (all, unless `timeout` ran out first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pushed = 0
        while pushed < len(events):
            if not wait_for(lambda: self.ring.free() > 0, _remaining(deadline)):
                break
            chunk = events[pushed:pushed + self.ring.free()]
            tail = self.ring.tail
            self.ring.write(tail, _encode_events(chunk))
            self.ring.words[TAIL_INDEX] = tail + len(chunk)  # after the payload: this store publishes it
            pushed += len(chunk)
        return pushed


def _encode_events(events: list[TokenEvent]) -> np.ndarray:
    records = np.zeros(len(events), TOKEN_DTYPE)
    names = ("req_id", "token_id", "position", "finish_reason", "logprob")
    rows = [(e.req_id, e.token_id, e.position, int(e.finish_reason), e.logprob) for e in events]
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        records[name] = _checked(column, TOKEN_DTYPE[name], name)
    for i, event in enumerate(events):
        if num_top := len(event.top_ids):
            if num_top > MAX_TOP_LOGPROBS or len(event.top_logprobs) != num_top:
                raise ValueError(f"an event carries 0..{MAX_TOP_LOGPROBS} top_ids with as many top_logprobs")
            records["num_top"][i] = num_top
            records["top_ids"][i, :num_top] = event.top_ids
            records["top_logprobs"][i, :num_top] = event.top_logprobs
    return records


class EgressConsumer:
    """Front-end side of the egress ring."""

    def __init__(self, seg: Segment):
        self.ring = _egress_ring(seg)

    def poll(self, max_items: int = 1 << 30) -> list[TokenEvent]:
        """Take up to `max_items` events without waiting (possibly none)."""
        head = self.ring.head
        count = min(self.ring.tail - head, max_items)
        if count <= 0:
            return []
        records = self.ring.read(head, count)
        self.ring.words[HEAD_INDEX] = head + count  # after the copy: the producer may now reuse the slots
        # Column-wise tolist() is far cheaper than touching each record's fields from Python.
        events = [
            TokenEvent(req_id, token_id, position, FINISH_REASONS[finish], logprob)
            for req_id, token_id, position, finish, logprob in zip(
                records["req_id"].tolist(), records["token_id"].tolist(), records["position"].tolist(),
                records["finish_reason"].tolist(), records["logprob"].tolist(), strict=True)
        ]
        for i, num_top in enumerate(records["num_top"].tolist()):
            if num_top:
                events[i].top_ids = records["top_ids"][i, :num_top].tolist()
                events[i].top_logprobs = records["top_logprobs"][i, :num_top].tolist()
        return events

    def wait(self, timeout: float | None, max_items: int = 1 << 30) -> list[TokenEvent]:
        """Like poll, but first waits (backing off) up to `timeout` seconds for at least one event."""
        wait_for(lambda: self.ring.used() > 0, timeout)
        return self.poll(max_items)


def _checked(values, dtype, what: str) -> np.ndarray:
    """`values` as an array of `dtype`, or ValueError naming `what` when one does not fit."""
    try:
        return np.asarray(values, dtype=dtype)
    except (OverflowError, TypeError, ValueError) as e:
        raise ValueError(f"{what} out of range for {np.dtype(dtype)}: {e}") from None
