"""The peer-to-peer all-reduce's shared layouts: the kernel parameters as ctypes declares them equal the
C++ struct (compiled here with nvcc), and the arena's regions are 16-byte aligned and disjoint."""
from __future__ import annotations

import ctypes as C

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blink.device import build
from blink.parallel.p2p_allreduce import MAX_WORLD, P2PAllReduceParams, arena_layout


@pytest.mark.skipif(build.nvcc_path() is None, reason="needs nvcc")
@pytest.mark.timeout(300)
def test_params_match_the_kernel_struct():
    path = build.build_device_library("sm_90")
    try:
        lib = C.CDLL(str(path))
    except OSError as e:  # no libcudart on the loader path
        pytest.skip(f"cannot load the device library here: {e}")
    names = [name for name, _ in P2PAllReduceParams._fields_]
    out = (C.c_uint64 * (1 + len(names)))()
    lib.blink_p2p_params_layout(out)
    assert list(out) == [C.sizeof(P2PAllReduceParams)] + [getattr(P2PAllReduceParams, n).offset for n in names]


@given(world=st.integers(2, MAX_WORLD), max_elems=st.integers(0, 1 << 16).map(lambda n: n * 8),
       ll_max_elems=st.integers(0, 1 << 16).map(lambda n: n * 8))
def test_arena_regions_are_aligned_and_disjoint(world, max_elems, ll_max_elems):
    layout = arena_layout(world, max_elems, ll_max_elems)
    regions = ["stage", "flags", "epochs", "lines", "ll_state"]
    starts = [layout[r] for r in regions] + [layout["total"]]
    assert all(s % 16 == 0 for s in starts)
    assert starts == sorted(starts)
    assert layout["lines"] - layout["epochs"] >= 64 * 4  # one epoch per block
    assert layout["ll_state"] - layout["lines"] >= 2 * world * ll_max_elems // 4 * 16
    assert layout["total"] - layout["ll_state"] >= 16
    assert layout["flags"] >= 2 * world * max_elems * 2
