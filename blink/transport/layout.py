"""The one definition of the shared-memory layout: control block, ingress ring, token arena, egress ring.

blink/device/csrc/layout.h mirrors these structs for the GPU; tests/transport/test_layout_header.py
compiles it and checks every offset and size against this file.

Indices: every ring and the arena use monotonically increasing 64-bit counters; the slot of counter c is
c % capacity. `tail` is written only by the producer, `head` only by the consumer (single producer,
single consumer, no read-modify-write across PCIe). Producer: write the payload, then publish tail.
"""
from __future__ import annotations

import bisect
import ctypes as C
from dataclasses import dataclass

from blink.request import MAX_STOP_TOKEN_IDS, MAX_TOP_LOGPROBS

MAGIC = 0x4B4E494C42  # "BLINK"
VERSION = 5  # 2: the control block publishes the engine's limits; 3: prefix caching; 4: grammar staging;
# 5: busy step intervals
MAX_PUBLISHED_BUCKETS = 16
CACHE_LINE = 64
PAGE = 4096

KIND_REQUEST = 1
KIND_ABORT = 2
FLAG_IGNORE_EOS = 1
FLAG_CONSTRAINT = 2  # structured output: host mode reads the constraint's text after logit_bias in the
# arena; device mode reads its compiled tables in the grammar staging slot the descriptor names
# Structured outputs in device mode: one grammar staging slot per arena partition (blink/grammar/arena.py)
GRAMMAR_SLOTS = 16
# Prompt logprobs: flags bits 8-15 hold prompt_logprobs + 1 (0 = none). The engine answers
# with one prompt record per prompt token after the first, before the first token's record: a TokenRecord
# with position = -(prompt index), token_id the prompt token, its logprob and top logprobs, and its rank in
# queue_us.
PROMPT_LOGPROBS_SHIFT = 8
PROMPT_LOGPROBS_MASK = 0xFF << PROMPT_LOGPROBS_SHIFT

ENGINE_MODE_NONE = 0  # ControlBlock.engine_mode
ENGINE_MODE_HOST = 1
ENGINE_MODE_DEVICE = 2
ITERATION_TOKEN_BOUNDS = (1, 8, 32, 128, 512, 2048)  # ControlBlock.iteration_tokens buckets, plus one above
STEP_INTERVAL_BOUNDS_NS = tuple(ms * 1_000_000 for ms in (5, 10, 25, 50, 100, 250))  # ControlBlock.step_intervals
DTYPE_NAMES = ("unknown", "float32", "float16", "bfloat16")  # ControlBlock.dtype


def step_interval_bucket(ns: int) -> int:
    """ControlBlock.step_intervals' bucket of a busy step interval (layout.h's step_interval_bucket)."""
    return bisect.bisect_left(STEP_INTERVAL_BOUNDS_NS, ns)


class ControlBlock(C.Structure):
    """Engine status and host->engine commands. Written by the engine unless noted."""

    _fields_ = [
        ("magic", C.c_uint64),
        ("version", C.c_uint32),
        ("engine_mode", C.c_uint32),  # 0 = not attached, 1 = host, 2 = device
        ("ingress_capacity", C.c_uint64),  # sizes, written by the creator (front end)
        ("arena_capacity", C.c_uint64),
        ("egress_capacity", C.c_uint64),
        # grammar staging (structured outputs in device mode), written by the creator: slots, int32 words each
        ("grammar_slots", C.c_uint32),
        ("grammar_slot_words", C.c_uint32),
        ("_pad0", C.c_uint8 * 16),
        # line 1: commands from the host / front end
        ("stop_flag", C.c_uint32),  # set to 1 by the parent: finish the step and exit
        ("drain_flag", C.c_uint32),  # set to 1 by the parent: the front end takes no new requests
        ("ingress_closed", C.c_uint32),  # set to 1 by the front end after its last descriptor: once all
        # it sent is served, the engine exits on its own (the drain is over)
        ("reset_prefix_cache", C.c_uint32),  # bumped by the front end: forget the cached KV blocks once
        ("_pad1", C.c_uint8 * 48),
        # line 2: live counters from the engine (for /metrics and /health)
        ("ready", C.c_uint32),  # 1 once the engine serves the rings
        ("running", C.c_uint32),
        ("waiting", C.c_uint32),
        ("free_kv_blocks", C.c_uint32),
        ("total_kv_blocks", C.c_uint32),
        ("error_code", C.c_int32),  # last engine-side error (0 = none), e.g. a device launch error
        ("heartbeat", C.c_uint64),  # bumped by the engine loop, also when idle
        ("steps", C.c_uint64),
        ("tokens", C.c_uint64),  # generated tokens
        ("preemptions", C.c_uint64),
        ("exited", C.c_uint32),  # 1 once the engine loop has returned
        ("_pad2", C.c_uint8 * 4),
        # lines 3-4: the engine's limits (blink/core/limits.py), written before `ready`, read by the front end
        ("max_model_len", C.c_uint32),
        ("max_num_seqs", C.c_uint32),
        ("max_num_batched_tokens", C.c_uint32),
        ("block_size", C.c_uint32),
        ("num_kv_blocks", C.c_uint32),
        ("vocab_size", C.c_uint32),
        ("num_buckets", C.c_uint32),  # captured graph buckets: their token counts follow
        ("dtype", C.c_uint32),  # for the start-up banner: an index into DTYPE_NAMES
        ("graphs_captured", C.c_uint32),  # 1 when the buckets are CUDA graphs, 0 when the model runs eagerly
        # prompt logprobs: rows per step (0 = the engine refuses prompt logprobs)
        ("prompt_logprob_rows", C.c_uint32),
        ("_pad3", C.c_uint8 * 24),
        ("bucket_tokens", C.c_uint32 * MAX_PUBLISHED_BUCKETS),
        # line 5: tokens per engine step (vLLM's iteration_tokens_total): a count per ITERATION_TOKEN_BOUNDS
        # bucket (tokens <= bound, the last one unbounded) and their sum; written once per step
        ("iteration_tokens", C.c_uint64 * 7),
        ("iteration_tokens_sum", C.c_uint64),
        # line 6: prefix caching (blink/core/prefix_cache.py), from the engine
        ("prefix_cache_queries", C.c_uint64),  # prompt tokens looked up at admissions
        ("prefix_cache_hits", C.c_uint64),  # of those, found cached
        ("prefix_cache_resets", C.c_uint32),  # reset_prefix_cache commands applied (equal: the last is done)
        ("prefix_caching", C.c_uint32),  # 1 when the engine caches prefixes, written before `ready`
        ("_pad4", C.c_uint8 * 40),
        # line 7: busy step intervals, one step's completion to the next's with no idle turn between (the floor
        # under every stream's inter-token gap: an engine stall shows here, a front-end one does not): a count
        # per STEP_INTERVAL_BOUNDS_NS bucket (ns <= bound, the last unbounded) and their sum in ns
        ("step_intervals", C.c_uint64 * 7),
        ("step_intervals_sum_ns", C.c_uint64),
    ]


class RingHeader(C.Structure):
    """Head and tail on their own cache lines so producer and consumer never share one."""

    _fields_ = [
        ("tail", C.c_uint64),  # producer-owned
        ("_pad0", C.c_uint8 * 56),
        ("head", C.c_uint64),  # consumer-owned
        ("_pad1", C.c_uint8 * 56),
    ]


class RequestDescriptor(C.Structure):
    """One ingress record: a new request (KIND_REQUEST) or an abort (KIND_ABORT, only req_id used).

    The prompt is `prompt_len` int32 tokens at arena counter `arena_offset`, followed by
    `num_logit_bias` token ids and then `num_logit_bias` float32 biases (as int32 bits), then, under
    FLAG_CONSTRAINT with grammar_slot < 0 (host mode), the constraint: its kind (index in CONSTRAINT_KINDS),
    its byte length, its UTF-8 text padded to whole int32 words (blink/transport/ingress.py). With
    grammar_slot >= 0 (device mode) the text is not sent: the compiled tables are in that staging slot
    (blink/transport/grammar_staging.py). The consumer advances the arena head by `arena_len` once it has
    copied them out.
    """

    _fields_ = [
        ("kind", C.c_uint32),
        ("num_stop_ids", C.c_uint32),
        ("req_id", C.c_uint64),
        ("arena_offset", C.c_uint64),
        ("prompt_len", C.c_uint32),
        ("num_logit_bias", C.c_uint32),
        ("arena_len", C.c_uint32),
        ("max_tokens", C.c_uint32),
        ("min_tokens", C.c_uint32),
        ("flags", C.c_uint32),
        ("temperature", C.c_float),
        ("top_p", C.c_float),
        ("top_k", C.c_int32),
        ("min_p", C.c_float),
        ("presence_penalty", C.c_float),
        ("frequency_penalty", C.c_float),
        ("repetition_penalty", C.c_float),
        ("num_logprobs", C.c_int32),  # -1 = no logprobs, 0 = chosen token only, k = top-k too
        ("seed", C.c_uint64),
        ("stop_token_ids", C.c_int32 * MAX_STOP_TOKEN_IDS),
        # structured outputs in device mode (grammar staging): the slot holding the tables (-1: none), their
        # state and class counts, and the slot's write generation (the GPU copies when it differs from its own)
        ("grammar_slot", C.c_int32),
        ("grammar_states", C.c_int32),
        ("grammar_classes", C.c_int32),
        ("grammar_gen", C.c_uint32),
    ]


class TokenRecord(C.Structure):
    """One egress record: a generated token, or the end of a request (finish_reason != 0).

    A request's last record carries its finish reason; for abort/error with no new token, token_id = -1.
    """

    _fields_ = [
        ("req_id", C.c_uint64),
        ("token_id", C.c_int32),
        ("position", C.c_int32),  # index of this output token: 0, 1, 2, ...
        ("finish_reason", C.c_uint16),  # blink.request.FinishReason
        ("num_top", C.c_uint16),
        ("cached_tokens", C.c_uint32),  # prompt tokens the request found in the prefix cache
        ("logprob", C.c_float),
        ("queue_us", C.c_uint32),  # a request's first record only: us from engine ingest to first admission
        ("top_ids", C.c_int32 * MAX_TOP_LOGPROBS),
        ("top_logprobs", C.c_float * MAX_TOP_LOGPROBS),
    ]


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class SegmentLayout:
    """Byte offsets of each section inside the shared-memory segment."""

    ingress_capacity: int
    arena_capacity: int
    egress_capacity: int
    grammar_slots: int = 0  # grammar staging: 0 (no section) or GRAMMAR_SLOTS
    grammar_slot_words: int = 0  # int32 words per slot: a partition's class row plus its cells fit

    @property
    def control(self) -> int:
        return 0

    @property
    def ingress_header(self) -> int:
        return PAGE

    @property
    def ingress_records(self) -> int:
        return self.ingress_header + C.sizeof(RingHeader)

    @property
    def arena_header(self) -> int:
        return _align(self.ingress_records + self.ingress_capacity * C.sizeof(RequestDescriptor), PAGE)

    @property
    def arena_data(self) -> int:
        return self.arena_header + C.sizeof(RingHeader)

    @property
    def egress_header(self) -> int:
        return _align(self.arena_data + self.arena_capacity * 4, PAGE)

    @property
    def egress_records(self) -> int:
        return self.egress_header + C.sizeof(RingHeader)

    @property
    def grammar_staging(self) -> int:
        return _align(self.egress_records + self.egress_capacity * C.sizeof(TokenRecord), PAGE)

    @property
    def size(self) -> int:
        return _align(self.grammar_staging + self.grammar_slots * self.grammar_slot_words * 4, PAGE)


def grammar_staging(grammar_arena_bytes: int) -> tuple[int, int]:
    """SegmentLayout's (grammar_slots, grammar_slot_words) for an engine's grammar arena of that size: a slot
    per partition, as many words as a partition's bytes (blink/grammar/arena.py), which bound a grammar's
    class row plus its next-state cells. (0, 0) when structured outputs are off."""
    words = grammar_arena_bytes // GRAMMAR_SLOTS // 4
    return (GRAMMAR_SLOTS, words) if words > 0 else (0, 0)
