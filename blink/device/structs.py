"""ctypes mirrors of the scheduler's config and pointer structs (blink/device/csrc/sched_types.h).

tests/device/test_structs.py compiles a program against the header (g++, and nvcc when present) and checks
every field's name, offset, size and kind, every sizeof and every shared constant against this file. A
pointer field's pointee is declared in its struct's `_pointees_` (None: opaque to Python) and checked too;
the step buffers' and sampling state's pointee dtypes come from their one definition, StepBuffers.layout()
and SamplingState.layout(). No struct has implicit padding, so no C++-only field can hide.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import torch

from blink.core.step_buffers import StepBuffers
from blink.kernels.sampling_state import SamplingState
from blink.transport.layout import ControlBlock, RequestDescriptor, RingHeader, TokenRecord

MAX_BUCKETS = 32
MAX_EOS = 8
MAX_PEERS = 7  # tensor-parallel ranks besides rank 0
PEER_STOP = 0xFFFFFFFF  # the mailbox command that ends a follower's loop
# per launch (csrc/sched_types.h kTraceWords): %globaltimer ns of the launch call, completion seen, then
# tokens << 32 | rows, then the phase stamps: finish done, ingest done, plan done, inputs written, launch returned;
# then inside this launch's finish: rows advanced, frees done; inside its plan: scheduled (before the admissions);
# then 1 if it was launched ahead (csrc/sched_ahead.h: its scheduled stamp marks its rows checked, its ingest, plan
# and inputs stamps the end of its check, and the step before it finishes after its launch)
TRACE_WORDS = 12
TRACE_PHASES = ("launch", "done", "meta", "finish", "ingest", "plan", "inputs", "launched",
                "rows", "frees", "scheduled", "ahead")
TRACE_META = TRACE_PHASES.index("meta")


def trace_step_sizes(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, rows) of each launch in a [launches, TRACE_WORDS] trace (its meta word)."""
    meta = trace[:, TRACE_META].astype(np.uint64)
    return (meta >> 32).astype(np.int64), (meta & 0xFFFFFFFF).astype(np.int64)


SCHED_STATE_LAUNCHED = 8  # byte offset of SchedState.launched (uint64), read by the runtime after a stop
LAUNCHES_PER_KERNEL = 119  # fire-and-forget budget is 120 per execution; the 120th is the tail relaunch

# error_code values written by the scheduler (ControlBlock.error_code)
ERR_INVALID_DESCRIPTOR = 1
ERR_STEP_TIMEOUT = 2
ERR_NO_BUCKET = 3
ERR_AHEAD_MISMATCH = 4  # a step launched ahead was not the step the plan then made (csrc/sched_ahead.h: a bug)
ERR_LAUNCH_BASE = 1000  # + cudaError_t of a forward launch
ERR_TAIL_LAUNCH_BASE = 2000  # + cudaError_t of the scheduler's tail relaunch


def describe_error(code: int) -> str:
    if code == 0:
        return "no error"
    if code == ERR_INVALID_DESCRIPTOR:
        return "an invalid request descriptor was refused (its request got finish_reason ERROR)"
    if code == ERR_STEP_TIMEOUT:
        return "a forward graph never signalled completion (step timeout)"
    if code == ERR_NO_BUCKET:
        return "a step fit no captured bucket (configuration mismatch)"
    if code == ERR_AHEAD_MISMATCH:
        return "a step launched ahead differed from the step then planned (a scheduler bug; its requests got ERROR)"
    if code >= ERR_TAIL_LAUNCH_BASE:
        return f"the scheduler's tail relaunch failed with cudaError {code - ERR_TAIL_LAUNCH_BASE}"
    if code >= ERR_LAUNCH_BASE:
        return f"a device-side forward graph launch failed with cudaError {code - ERR_LAUNCH_BASE}"
    return f"error code {code}"


class SchedConfig(C.Structure):
    _fields_ = [
        ("max_num_seqs", C.c_int32),
        ("max_num_batched_tokens", C.c_int32),
        ("max_model_len", C.c_int32),
        ("block_size", C.c_int32),
        ("num_blocks", C.c_int32),
        ("max_blocks_per_seq", C.c_int32),
        ("max_requests", C.c_int32),
        ("vocab_size", C.c_int32),
        ("num_buckets", C.c_int32),
        ("num_eos", C.c_int32),
        ("trace_capacity", C.c_int32),
        ("launches_per_kernel", C.c_int32),
        ("bucket_tokens", C.c_int32 * MAX_BUCKETS),
        ("bucket_seqs", C.c_int32 * MAX_BUCKETS),
        ("eos_ids", C.c_int32 * MAX_EOS),
        ("step_timeout_ns", C.c_int64),
        ("enable_prefix_caching", C.c_int32),  # share cached prompt prefixes' KV blocks (csrc/sched_prefix.h)
        ("prompt_logprob_rows", C.c_int32),  # prompt logprobs: rows per step (StepBuffers.prompt_*), 0 = refused
        # structured outputs (csrc/sched_grammar.h): the grammar arena's geometry (blink/grammar/arena.py)
        ("grammar_slots", C.c_int32),
        ("grammar_states_per_slot", C.c_int32),
        ("grammar_cells_per_slot", C.c_int32),
        ("grammar_reserved", C.c_int32),
        # issue 19, idle energy (csrc/scheduler.cu, device/idle.py): backoff caps, deep-idle and park thresholds
        ("idle_max_ns", C.c_int32),
        ("idle_deep_max_ns", C.c_int32),
        ("idle_deep_after_ns", C.c_int64),
        ("idle_park_after_ns", C.c_int64),  # 0: never park
        ("sampler_variants", C.c_int32),  # graphs per bucket: 1, or 2 with the searchless one (csrc/sched_variant.h)
        ("decode_pace_us", C.c_int32),  # issue 19, energy: decodes-only steps paced (csrc/sched_pace.h), 0 = off
        ("decode_pace_max_batch", C.c_int32),  # the pace holds at most this many running sequences, 0 = any
        ("_pad0", C.c_int32),  # the struct's 8-byte alignment, explicit
    ]


CTYPE_OF = {torch.int64: C.c_int64, torch.int32: C.c_int32, torch.float32: C.c_float, torch.uint8: C.c_uint8}
# The shapes do not matter here, only the names, their order and the element dtypes.
STEP_BUFFER_DTYPES = {name: dtype for name, _, dtype in StepBuffers.layout(1, 1, 1)}
SAMPLING_DTYPES = ({name: dtype for name, _, dtype, _ in SamplingState.layout(1, 1)}
                   | dict(SamplingState.GRAMMAR_TENSORS))
STEP_BUFFER_FIELDS = tuple(STEP_BUFFER_DTYPES)
SAMPLING_FIELDS = tuple(SAMPLING_DTYPES)


class StepBufferPtrs(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in STEP_BUFFER_FIELDS]
    _pointees_ = {name: CTYPE_OF[dtype] for name, dtype in STEP_BUFFER_DTYPES.items()}


class SamplingPtrs(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in SAMPLING_FIELDS]
    _pointees_ = {name: CTYPE_OF[dtype] for name, dtype in SAMPLING_DTYPES.items()}


class RingPtrs(C.Structure):
    _fields_ = [
        ("control", C.c_void_p),
        ("ingress_header", C.c_void_p),
        ("ingress", C.c_void_p),
        ("arena_header", C.c_void_p),
        ("arena", C.c_void_p),
        ("egress_header", C.c_void_p),
        ("egress", C.c_void_p),
        ("ingress_capacity", C.c_uint64),
        ("arena_capacity", C.c_uint64),
        ("egress_capacity", C.c_uint64),
        ("grammar_staging", C.c_void_p),  # structured outputs in device mode (None: no staging section)
        ("grammar_slot_words", C.c_uint64),
    ]
    _pointees_ = {"control": ControlBlock, "ingress_header": RingHeader, "ingress": RequestDescriptor,
                  "arena_header": RingHeader, "arena": C.c_int32, "egress_header": RingHeader, "egress": TokenRecord,
                  "grammar_staging": C.c_int32}


class PeerPtrs(C.Structure):
    _fields_ = [("buffers", StepBufferPtrs * 2), ("mailbox", C.c_void_p)]
    _pointees_ = {"mailbox": C.c_uint64}


class PeerTable(C.Structure):
    _fields_ = [("num_peers", C.c_int32), ("reserved", C.c_int32), ("peers", PeerPtrs * MAX_PEERS)]


class LoopHooks(C.Structure):
    """The self-test's loop variants (csrc/sched_types.h), kept out of SchedConfig: None in production."""

    _fields_ = [("relaunch_each_step", C.c_int32), ("fail_bucket", C.c_int32), ("ingest_between_forwards", C.c_int32),
                ("no_launch_ahead", C.c_int32), ("no_warm_ahead", C.c_int32), ("reserved", C.c_int32)]


class LoopParams(C.Structure):
    _fields_ = [
        ("cfg", SchedConfig),
        ("state", C.c_void_p),
        ("rings", RingPtrs),
        ("buffers", StepBufferPtrs * 2),
        ("sampling", SamplingPtrs),
        ("graph_execs", C.c_void_p),
        ("trace", C.c_void_p),
        ("peers", C.c_void_p),  # PeerTable in device memory, or None
        ("hooks", C.c_void_p),  # LoopHooks in device memory, or None (production)
    ]
    # state: SchedState, sized by blink_sched_state_bytes;
    # graph_execs: cudaGraphExec_t[sampler_variants][num_buckets][2] (csrc/sched_variant.h)
    _pointees_ = {"state": None, "graph_execs": None, "trace": C.c_uint64, "peers": PeerTable, "hooks": LoopHooks}


class FollowerState(C.Structure):  # csrc/sched_types.h, written by csrc/follower.cuh
    _fields_ = [
        ("done_count", C.c_uint32),
        ("exited", C.c_uint32),
        ("last_seq", C.c_uint64),
        ("launched", C.c_uint64),
        ("launches_this_kernel", C.c_int32),
        ("error_code", C.c_int32),
        ("heartbeat", C.c_uint64),
    ]


class FollowerParams(C.Structure):  # csrc/sched_types.h
    _fields_ = [
        ("mailbox", C.c_void_p),
        ("state", C.c_void_p),
        ("graph_execs", C.c_void_p),
        ("num_buckets", C.c_int32),
        ("launches_per_kernel", C.c_int32),
        ("step_timeout_ns", C.c_int64),
    ]
    _pointees_ = {"mailbox": C.c_uint64, "state": FollowerState, "graph_execs": None}


def ring_pointers(address: int, layout) -> RingPtrs:
    """Pointers into a segment mapped at `address` (on the GPU the same address, once registered)."""
    return RingPtrs(
        control=address + layout.control, ingress_header=address + layout.ingress_header,
        ingress=address + layout.ingress_records, arena_header=address + layout.arena_header,
        arena=address + layout.arena_data, egress_header=address + layout.egress_header,
        egress=address + layout.egress_records, ingress_capacity=layout.ingress_capacity,
        arena_capacity=layout.arena_capacity, egress_capacity=layout.egress_capacity,
        grammar_staging=address + layout.grammar_staging if layout.grammar_slots else None,
        grammar_slot_words=layout.grammar_slot_words)


def grammar_config(cfg: SchedConfig, state: SamplingState) -> None:
    """The grammar arena's geometry into the scheduler's config (what its admission copy writes into)."""
    cfg.grammar_slots = state.grammar_slots
    cfg.grammar_states_per_slot = state.grammar_states_per_slot
    cfg.grammar_cells_per_slot = state.grammar_cells_per_slot
