"""The ingress ring: request descriptors and aborts from the front end to the engine, prompts (and logit_bias,
a constraint's text for host mode) in the token arena. The protocol is blink/transport/ring.py's. A device-mode
engine gets a constraint as compiled tables in grammar staging instead (grammar_staging.py)."""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from blink.request import (
    CONSTRAINT_KINDS,
    MAX_STOP_TOKEN_IDS,
    SEED_BITS,
    Constraint,
    SamplingParams,
    request_seed,
)
from blink.transport.grammar_staging import GrammarStaging
from blink.transport.layout import (
    ENGINE_MODE_DEVICE,
    FLAG_CONSTRAINT,
    FLAG_IGNORE_EOS,
    KIND_ABORT,
    KIND_REQUEST,
    PROMPT_LOGPROBS_MASK,
    PROMPT_LOGPROBS_SHIFT,
)
from blink.transport.ring import DESCRIPTOR_DTYPE, HEAD_INDEX, TAIL_INDEX, _checked, _Ring, wait_for
from blink.transport.shm import Segment


def _ingress_rings(seg: Segment) -> tuple[_Ring, _Ring]:
    layout = seg.layout
    descriptors = seg.array(DESCRIPTOR_DTYPE, layout.ingress_capacity, layout.ingress_records)
    arena = seg.array(np.int32, layout.arena_capacity, layout.arena_data)
    return _Ring(seg, layout.ingress_header, descriptors), _Ring(seg, layout.arena_header, arena)


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
        self.control, self.staging = seg.control, GrammarStaging.of(seg)
        self.base_seed = random.SystemRandom().getrandbits(SEED_BITS) if base_seed is None else base_seed

    def submit(self, req_id: int, prompt_ids: list[int], params: SamplingParams,
               timeout: float | None = None) -> bool:
        """Enqueue a request; False if the ring or the arena stayed full for `timeout` seconds.

        Raises ValueError for what can never be sent (too long for the arena, values out of range).
        """
        params.validate()  # the fields may have changed since construction; the engine gets only valid ones
        # A device-mode engine cannot compile: it reads the constraint's tables, staged by the caller.
        staged = params.constraint is not None and int(self.control.engine_mode) == ENGINE_MODE_DEVICE
        if staged and (self.staging is None or self.staging.slot_of(params.constraint) is None):
            raise ValueError("a constrained request to a device-mode engine needs its grammar staged first")
        payload = self._payload(prompt_ids, params, with_text=not staged)
        if len(payload) > self.arena.capacity:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens (+{len(params.logit_bias)} logit_bias "
                             f"entries) does not fit the ingress arena ({self.arena.capacity} int32 slots)")
        record = self._descriptor(req_id, prompt_ids, params, len(payload))

        def has_room() -> bool:
            return self.descriptors.free() > 0 and self.arena.free() >= len(payload)

        if not wait_for(has_room, timeout):
            return False
        if staged:  # from here it holds its slot until its last record (EgressConsumer)
            (record["grammar_slot"], record["grammar_states"], record["grammar_classes"],
             record["grammar_gen"]) = self.staging.bind(req_id, params.constraint)
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
    def _payload(prompt_ids: list[int], params: SamplingParams, with_text: bool = True) -> np.ndarray:
        """prompt ids, then logit_bias token ids, then logit_bias values as float32 bits (then, for host mode,
        the constraint's text)."""
        prompt = _checked(prompt_ids, np.int32, "prompt token id")
        bias_ids = _checked(list(params.logit_bias.keys()), np.int32, "logit_bias token id")
        bias_values = np.asarray(list(params.logit_bias.values()), np.float32).view(np.int32)
        parts = [prompt, bias_ids, bias_values]
        if params.constraint is not None and with_text:
            parts.append(_constraint_words(params.constraint))
        return np.concatenate(parts).astype(np.int32, copy=False)

    def _descriptor(self, req_id: int, prompt_ids: list[int], params: SamplingParams,
                    arena_len: int) -> np.ndarray:
        if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are supported")
        seed = request_seed(params, req_id, self.base_seed)
        fields = {
            "kind": KIND_REQUEST, "num_stop_ids": len(params.stop_token_ids), "req_id": req_id,
            "prompt_len": len(prompt_ids), "num_logit_bias": len(params.logit_bias), "arena_len": arena_len,
            "max_tokens": params.max_tokens, "min_tokens": params.min_tokens,
            "flags": (FLAG_IGNORE_EOS if params.ignore_eos else 0)
                     | (FLAG_CONSTRAINT if params.constraint is not None else 0)
                     | ((params.prompt_logprobs + 1) << PROMPT_LOGPROBS_SHIFT if params.prompt_logprobs is not None
                        else 0),
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "min_p": params.min_p, "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "repetition_penalty": params.repetition_penalty,
            "num_logprobs": -1 if params.logprobs is None else params.logprobs,
            "seed": seed % (1 << 64),  # the engine keys its RNG on these 64 bits
            "grammar_slot": -1,  # set at submit for a staged grammar
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
    constraint = None
    if record["flags"] & FLAG_CONSTRAINT and record["grammar_slot"] >= 0:
        raise ValueError("a descriptor for a device-mode engine (staged grammar) reached a host-mode consumer")
    if record["flags"] & FLAG_CONSTRAINT:
        constraint = _decode_constraint(payload[prompt_len + 2 * num_bias:])
    params = SamplingParams(
        temperature=record["temperature"], top_p=record["top_p"], top_k=record["top_k"],
        min_p=record["min_p"], presence_penalty=record["presence_penalty"],
        frequency_penalty=record["frequency_penalty"], repetition_penalty=record["repetition_penalty"],
        logit_bias=dict(zip(bias_ids, bias_values, strict=True)), seed=record["seed"],
        max_tokens=record["max_tokens"], min_tokens=record["min_tokens"],
        stop_token_ids=record["stop_token_ids"][:record["num_stop_ids"]].tolist(),
        ignore_eos=bool(record["flags"] & FLAG_IGNORE_EOS),
        logprobs=None if record["num_logprobs"] < 0 else record["num_logprobs"],
        constraint=constraint,
        prompt_logprobs=((record["flags"] & PROMPT_LOGPROBS_MASK) >> PROMPT_LOGPROBS_SHIFT) - 1
        if record["flags"] & PROMPT_LOGPROBS_MASK else None,
    )
    return IngressItem("request", record["req_id"], payload[:prompt_len].tolist(), params)


def _constraint_words(c: Constraint) -> np.ndarray:
    """kind, byte length, then the UTF-8 text padded to whole int32 words."""
    text = c.spec.encode()
    padded = text + b"\0" * (-len(text) % 4)
    head = np.asarray([CONSTRAINT_KINDS.index(c.kind), len(text)], np.int32)
    return np.concatenate([head, np.frombuffer(padded, np.int32)])


def _decode_constraint(words: np.ndarray) -> Constraint:
    kind, length = int(words[0]), int(words[1])
    text = words[2:].astype(np.int32).tobytes()[:length].decode()
    return Constraint(CONSTRAINT_KINDS[kind], text)
