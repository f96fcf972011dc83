"""blink/device/csrc/sched_types.h must match blink/device/structs.py field by field (tests/abi_dump.py):
every field's name, offset, size and kind, every pointer's pointee (which must be the dtype the Python side
allocates), every sizeof and every constant the two sides share; compiled with g++, and with nvcc (its
device passes check the same facts as static_asserts) where the CUDA toolkit is installed."""
from __future__ import annotations

import ctypes as C
import shutil
from dataclasses import fields

import pytest
import torch

from blink import request
from blink.core.step_buffers import StepBuffers
from blink.device import structs
from blink.kernels import sampling_state
from blink.kernels.sampling_state import SamplingState
from tests.abi_dump import AbiDump, ctypes_kind, padding_holes

STRUCTS = [structs.SchedConfig, structs.StepBufferPtrs, structs.SamplingPtrs, structs.RingPtrs, structs.PeerPtrs,
           structs.PeerTable, structs.LoopHooks, structs.LoopParams, structs.FollowerState, structs.FollowerParams]
CONSTANTS = {
    "kMaxBuckets": structs.MAX_BUCKETS, "kMaxEos": structs.MAX_EOS, "kMaxLogitBias": request.MAX_LOGIT_BIAS,
    "kTraceWords": structs.TRACE_WORDS, "kFlagPenalties": sampling_state.FLAG_PENALTIES,
    "kFlagLogitBias": sampling_state.FLAG_LOGIT_BIAS,
    "kFlagGrammar": sampling_state.FLAG_GRAMMAR, "kErrInvalidDescriptor": structs.ERR_INVALID_DESCRIPTOR,
    "kErrStepTimeout": structs.ERR_STEP_TIMEOUT, "kErrNoBucket": structs.ERR_NO_BUCKET,
    "kErrAheadMismatch": structs.ERR_AHEAD_MISMATCH,
    "kErrLaunchBase": structs.ERR_LAUNCH_BASE, "kErrTailLaunchBase": structs.ERR_TAIL_LAUNCH_BASE,
    "kMaxPeers": structs.MAX_PEERS, "kPeerStop": structs.PEER_STOP,
}
# SchedState is not mirrored; the runtime reads one word of it.
EXTRA_CODE = ['std::printf("SchedState.launched %zu %zu\\n", offsetof(blink::SchedState, launched), '
              "sizeof(blink::SchedState::launched));"]
EXTRA_LINES = [f"SchedState.launched {structs.SCHED_STATE_LAUNCHED} 8"]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def dump(replace: type | None = None) -> AbiDump:
    """The dump of sched_types.h; `replace`: a mutated mirror standing in for the struct of its name."""
    mirrors = [replace if replace is not None and s.__name__ == replace.__name__ else s for s in STRUCTS]
    return AbiDump("sched_types.h", mirrors, CONSTANTS, EXTRA_CODE, EXTRA_LINES)


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> list[str]:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    return dump().run("g++", tmp_path_factory.mktemp("abi"))


def test_python_structs_have_no_implicit_padding():
    for struct in STRUCTS:  # a hole would be where a C++-only field hides: pad explicitly (see PeerTable)
        assert padding_holes(struct) == 0, struct


def test_every_pointer_field_declares_its_pointee():
    for struct in STRUCTS:
        pointers = {name for name, ctype in struct._fields_ if ctypes_kind(ctype) == "p"}
        assert set(getattr(struct, "_pointees_", {})) == pointers, struct


def test_pointees_are_the_dtypes_python_allocates():
    buffers = StepBuffers.allocate(8, 4, 3, "cpu")
    assert tuple(f.name for f in fields(StepBuffers)) == structs.STEP_BUFFER_FIELDS == tuple(buffers.pointers())
    state = SamplingState(3, 11, "cpu")
    for struct, source, names in [(structs.StepBufferPtrs, buffers, structs.STEP_BUFFER_FIELDS),
                                  (structs.SamplingPtrs, state, structs.SAMPLING_FIELDS)]:
        assert [name for name, _ in struct._fields_] == list(names)
        for name in names:
            tensor = getattr(source, name)
            assert tensor.is_contiguous(), name
            assert C.sizeof(struct._pointees_[name]) == tensor.element_size(), name
            assert structs.CTYPE_OF[tensor.dtype] is struct._pointees_[name], name
    assert set(vars(state)) >= set(structs.SAMPLING_FIELDS)


def test_trace_phases_name_every_trace_word():
    assert len(structs.TRACE_PHASES) == structs.TRACE_WORDS


@needs_gxx
def test_header_matches_ctypes(printed):
    assert printed == dump().expected()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.timeout(300)
def test_header_matches_ctypes_under_nvcc(tmp_path):
    assert dump().run("nvcc", tmp_path) == dump().expected()


def _mirror(struct: type, fields_: list, pointees: dict | None = None) -> type:
    body = {"_fields_": fields_, "_pointees_": getattr(struct, "_pointees_", {}) if pointees is None else pointees}
    return type(struct.__name__, (C.Structure,), body)


@needs_gxx
@pytest.mark.parametrize("change", ["swap two pointers", "retype a pointee", "retype an int", "swap arrays"])
def test_same_size_drift_is_caught(printed, change):
    """What the old size-only check let through. The set of printed lines is what a program generated from the
    mutated mirror would print (each line depends only on the C++ field of that name), so no recompiling."""
    if change == "swap two pointers":
        f = list(structs.StepBufferPtrs._fields_)
        f[0], f[1] = f[1], f[0]  # input_ids <-> positions, both int64*
        mutated = _mirror(structs.StepBufferPtrs, f)
    elif change == "retype a pointee":
        mutated = _mirror(structs.SamplingPtrs, structs.SamplingPtrs._fields_,
                          {**structs.SamplingPtrs._pointees_, "top_k": C.c_float})
    elif change == "retype an int":
        f = [(n, C.c_uint32 if n == "num_eos" else t) for n, t in structs.SchedConfig._fields_]
        mutated = _mirror(structs.SchedConfig, f)
    else:
        f = [(n, C.c_int64 * (structs.MAX_BUCKETS // 2) if n == "bucket_tokens" else t)
             for n, t in structs.SchedConfig._fields_]  # same bytes, other element type
        mutated = _mirror(structs.SchedConfig, f)
    assert set(printed) == set(dump().expected())
    assert set(printed) != set(dump(mutated).expected())


def test_ctypes_kinds():
    assert [ctypes_kind(t) for t in (C.c_float, C.c_int32, C.c_uint8, C.c_void_p, C.c_int64 * 3,
                                     structs.RingPtrs, structs.PeerPtrs * 2)] == list("fiupiss")
    assert structs.CTYPE_OF[torch.uint8] is C.c_uint8
