"""The control-plane C++ builds: the device library with nvcc (-rdc, cudadevrt), the host library with g++,
both cached by content; and the ctypes mirrors match what each build compiled."""
from __future__ import annotations

import ctypes as C
import os

import pytest

from blink.device import build, structs

needs_nvcc = pytest.mark.skipif(build.nvcc_path() is None, reason="needs nvcc")


def test_host_library_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE", str(tmp_path))
    first = build.build_host_library()
    mtime = os.stat(first).st_mtime_ns
    assert build.build_host_library() == first and os.stat(first).st_mtime_ns == mtime
    assert first.is_relative_to(tmp_path)


@needs_nvcc
@pytest.mark.timeout(300)
def test_device_library_compiles_and_its_abi_matches():
    path = build.build_device_library("sm_90")
    assert path.exists()
    try:
        lib = C.CDLL(str(path))
    except OSError as e:  # no libcudart on the loader path: the compile check above still stands
        pytest.skip(f"cannot load the device library here: {e}")
    out = (C.c_uint64 * len(structs.abi_layout()))()
    lib.blink_abi_layout(out)
    assert list(out) == structs.abi_layout()


def test_a_broken_source_fails_with_the_compiler_message(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="building libx.so failed"):
        build._compile("libx.so", ["g++", "-x", "c++", "-shared", "-o", "{out}", "/dev/null", "-lnot_a_library_x"])


def test_error_codes_read_as_sentences():
    assert "cudaError 200" in structs.describe_error(structs.ERR_LAUNCH_BASE + 200)
    assert "tail relaunch" in structs.describe_error(structs.ERR_TAIL_LAUNCH_BASE + 1)
    assert "invalid request descriptor" in structs.describe_error(structs.ERR_INVALID_DESCRIPTOR)
