"""Programmatic dependent launch (PDL) for the Triton kernels of a step.

With PDL a kernel may be launched while the one before it in the stream still runs: its programs become
resident, do their index arithmetic (and read what the previous kernel cannot have written: the weights),
then block in `griddepcontrol.wait` until the previous kernel has finished and its writes are visible.
That hides the launch latency and the ramp-up between kernels, which CUDA graphs alone do not. Stream
capture turns the launch attribute into a programmatic edge of the graph, so captured steps keep it.

Every kernel launched with PDL must call `pdl_wait` in every program before it exits and before it
touches what the kernel just before it may write (test_compile_sm90 checks that the PDL variants wait).
pdl_wait waits first and only then lets the next kernel launch, so when a kernel starts, every kernel two
or more places before it has finished: what they wrote, and the step's inputs written before the graph
(positions, slots, block tables, seq lens), may be read before the wait. Kernels launched without PDL
(cuBLAS) wait for their predecessor as usual, so a PDL kernel after a GEMM is correct too. Hopper and
later only; on by default (`BLINK_PDL=0` turns it off): with the one-row GEMV it cut llama3-8b's batch-1
step 4.4% on the H200, and device-launched graphs with its edges passed the device self-test (perf.md,
2026-12-02). The switch is read at each launch on the host, i.e. when a graph is captured, never per replayed
step.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# "model": the model's kernels; "sampler": the sampler's seven, which also needs "model". The sampler's default
# ("one_row") takes PDL for one-row calls only: on the H200, top_p at S = 1 went 43.8 -> 40.5 us, at S = 8
# 61.8 -> 62.1, at S = 32 128.5 -> 133.7 (perf.md, 2026-12-02 session 12). BLINK_SAMPLER_PDL=1 / 0: always / never.
_SAMPLER_ENV = {"1": True, "0": False, "one_row": "one_row"}


def _sampler_setting() -> bool | str:
    value = os.environ.get("BLINK_SAMPLER_PDL", "one_row")
    if value not in _SAMPLER_ENV:
        raise ValueError(f"BLINK_SAMPLER_PDL must be one of {sorted(_SAMPLER_ENV)}, got {value!r}")
    return _SAMPLER_ENV[value]


# "gemv_rows": the decode GEMV above one row (gemv_rows.py), also needing "model". Off by default
# (BLINK_GEMV_ROWS_PDL=1 turns it on): launched early, its programs (80-140 KB of shared memory each) took SMs
# beside the previous kernel's and then ran unevenly placed; at batch 8 on the H200 down_proj took 48.7 us in the
# step against 32.2 alone (perf.md, session 17).
_state = {"model": os.environ.get("BLINK_PDL", "1") == "1", "sampler": _sampler_setting(),
          "gemv_rows": os.environ.get("BLINK_GEMV_ROWS_PDL", "0") == "1"}
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def pdl_switched(on: bool, part: str = "model"):
    """PDL on or off for launches inside the block, then as it was (benches and tests that compare the two;
    graphs captured inside keep what they were captured with). part="sampler" / "gemv_rows": those kernels'
    own switch."""
    before = _state[part]
    _state[part] = on
    try:
        yield
    finally:
        _state[part] = before


def pdl_for(t: torch.Tensor) -> bool:
    """Whether to launch a kernel on t's device with PDL: on, CUDA, compute capability >= 9.0."""
    if not (_state["model"] and t.is_cuda) or _INTERPRETED:
        return False
    return _hopper_or_later(t.device.index if t.device.index is not None else torch.cuda.current_device())


def sampler_pdl_for(logits: torch.Tensor) -> bool:
    """pdl_for, for the sampler's kernels over `logits` [rows, V]: only with their own switch on as well (or at
    "one_row", for a one-row call)."""
    on = _state["sampler"]
    return (on is True or (on == "one_row" and logits.shape[0] == 1)) and pdl_for(logits)


def gemv_rows_pdl_for(x: torch.Tensor) -> bool:
    """pdl_for, for the decode GEMV above one row (gemv_rows.py): only with its own switch on as well."""
    return _state["gemv_rows"] and pdl_for(x)


@functools.cache
def _hopper_or_later(device: int) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the previous kernel's writes, then let the next kernel launch (no-ops without PDL)."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
