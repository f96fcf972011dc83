"""The control-plane C++ builds: the device library with nvcc (-rdc, cudadevrt), the host library with g++,
both cached by content; and both read the ctypes config the same way."""
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


def _config() -> structs.SchedConfig:
    return structs.SchedConfig(max_num_seqs=5, max_num_batched_tokens=64, max_model_len=100, block_size=16,
                               num_blocks=40, max_blocks_per_seq=7, max_requests=9, num_buckets=1)


@needs_nvcc
@pytest.mark.timeout(300)
def test_device_library_compiles_and_reads_the_config_as_the_host_build():
    """The layouts themselves are pinned by tests/device/test_structs.py (g++ and nvcc); here the built
    library exports every function build.py declares and sizes the state from a ctypes config as g++ does."""
    path = build.build_device_library("sm_90")
    assert path.exists()
    try:
        lib = build.load_device_library("sm_90")
    except OSError as e:  # no libcudart on the loader path: the compile check above still stands
        pytest.skip(f"cannot load the device library here: {e}")
    cfg = _config()
    assert lib.blink_sched_state_bytes(C.byref(cfg)) == build.load_host_library().blink_sched_state_bytes(C.byref(cfg))


def test_host_library_sizes_the_state_from_the_config():
    lib, cfg = build.load_host_library(), _config()
    small = lib.blink_sched_state_bytes(C.byref(cfg))
    cfg.max_model_len += 100  # the token store (int32 per request and position) grows by that, give or take
    grown = lib.blink_sched_state_bytes(C.byref(cfg))  # one 256-byte alignment: read where ctypes wrote it
    assert abs(grown - small - cfg.max_requests * 100 * 4) <= 256


def test_a_broken_source_fails_with_the_compiler_message(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="building libx.so failed"):
        build._compile("libx.so", ["g++", "-x", "c++", "-shared", "-o", "{out}", "/dev/null", "-lnot_a_library_x"])


def test_error_codes_read_as_sentences():
    assert "cudaError 200" in structs.describe_error(structs.ERR_LAUNCH_BASE + 200)
    assert "tail relaunch" in structs.describe_error(structs.ERR_TAIL_LAUNCH_BASE + 1)
    assert "invalid request descriptor" in structs.describe_error(structs.ERR_INVALID_DESCRIPTOR)
