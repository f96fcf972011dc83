"""ctypes mirrors of the scheduler's config and pointer structs (blink/device/csrc/sched_types.h).

tests/device/test_structs.py compares every size and offset with what the C++ build reports.
"""
from __future__ import annotations

import ctypes as C

import numpy as np

MAX_BUCKETS = 32
MAX_EOS = 8
MAX_PEERS = 7  # tensor-parallel ranks besides rank 0 (csrc/sched_types.h kMaxPeers)
PEER_STOP = 0xFFFFFFFF  # the mailbox command that ends a follower's loop
# per launch (csrc/sched_types.h kTraceWords): %globaltimer ns of the launch call, completion seen, then
# tokens << 32 | rows, then the phase stamps: finish done, ingest done, plan done, inputs written, launch returned
TRACE_WORDS = 8
TRACE_PHASES = ("launch", "done", "meta", "finish", "ingest", "plan", "inputs", "launched")
TRACE_META = TRACE_PHASES.index("meta")


def trace_step_sizes(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, rows) of each launch in a [launches, TRACE_WORDS] trace (its meta word)."""
    meta = trace[:, TRACE_META].astype(np.uint64)
    return (meta >> 32).astype(np.int64), (meta & 0xFFFFFFFF).astype(np.int64)


LAUNCHES_PER_KERNEL = 119  # fire-and-forget budget is 120 per execution; the 120th is the tail relaunch

# error_code values written by the scheduler (ControlBlock.error_code)
ERR_INVALID_DESCRIPTOR = 1
ERR_STEP_TIMEOUT = 2
ERR_NO_BUCKET = 3
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
        ("relaunch_each_step", C.c_int32),
        ("fail_bucket", C.c_int32),
        ("step_timeout_ns", C.c_int64),
        ("enable_prefix_caching", C.c_int32),  # share cached prompt prefixes' KV blocks (csrc/sched_prefix.h)
        ("reserved", C.c_int32),
    ]

    def __init__(self, **fields):
        fields.setdefault("fail_bucket", -1)  # 0 would be a real bucket
        super().__init__(**fields)


STEP_BUFFER_FIELDS = ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
                      "logits_indices", "sample_slots", "sample_positions", "sampled_ids", "logprobs", "top_ids",
                      "top_logprobs")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "bias_ids", "bias_vals", "output_counts", "prompt_mask", "flags",
                   "num_logprobs")


class StepBufferPtrs(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in STEP_BUFFER_FIELDS]


class SamplingPtrs(C.Structure):
    _fields_ = [(name, C.c_void_p) for name in SAMPLING_FIELDS]


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
    ]


class PeerPtrs(C.Structure):
    _fields_ = [("buffers", StepBufferPtrs * 2), ("mailbox", C.c_void_p)]


class PeerTable(C.Structure):
    _fields_ = [("num_peers", C.c_int32), ("reserved", C.c_int32), ("peers", PeerPtrs * MAX_PEERS)]


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
    ]


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


def abi_layout() -> list[int]:
    """What blink_abi_layout (csrc/abi.h) reports, computed from these mirrors."""
    return [
        C.sizeof(SchedConfig), SchedConfig.bucket_tokens.offset, SchedConfig.eos_ids.offset,
        SchedConfig.step_timeout_ns.offset, C.sizeof(StepBufferPtrs), C.sizeof(SamplingPtrs), C.sizeof(RingPtrs),
        C.sizeof(LoopParams), LoopParams.rings.offset, LoopParams.buffers.offset, LoopParams.sampling.offset,
        LoopParams.trace.offset, LoopParams.peers.offset, C.sizeof(PeerPtrs), C.sizeof(PeerTable),
        C.sizeof(FollowerParams), FollowerParams.step_timeout_ns.offset, C.sizeof(FollowerState),
    ]


def ring_pointers(address: int, layout) -> RingPtrs:
    """Pointers into a segment mapped at `address` (on the GPU the same address, once registered)."""
    return RingPtrs(
        control=address + layout.control, ingress_header=address + layout.ingress_header,
        ingress=address + layout.ingress_records, arena_header=address + layout.arena_header,
        arena=address + layout.arena_data, egress_header=address + layout.egress_header,
        egress=address + layout.egress_records, ingress_capacity=layout.ingress_capacity,
        arena_capacity=layout.arena_capacity, egress_capacity=layout.egress_capacity)
