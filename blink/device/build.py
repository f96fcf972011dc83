"""Builds the control-plane C++ once per source content and loads it with ctypes.

Two libraries from the same sources (csrc/): the device library (scheduler.cu; nvcc with -rdc and
cudadevrt, which torch's load_inline cannot do) and a host library (host_api.cpp; g++) that runs the very
same decision logic on the CPU for the tests. Builds are cached under $BLINK_CACHE (default
~/.cache/blink)/control/<content hash>/ and written atomically, so concurrent first uses are safe.
"""
from __future__ import annotations

import ctypes as C
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
DEFAULT_ARCH = "sm_90"


def cache_dir() -> Path:
    root = os.environ.get("BLINK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "blink")
    return Path(root) / "device"


def source_hash(extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".h", ".cuh", ".cu", ".cpp"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cuda_arch() -> str:
    """sm_XY of the current GPU (BLINK_CUDA_ARCH overrides; sm_90 when there is none)."""
    if os.environ.get("BLINK_CUDA_ARCH"):
        return os.environ["BLINK_CUDA_ARCH"]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except ImportError:
        pass
    return DEFAULT_ARCH


def _compile(name: str, command: list[str]) -> Path:
    """Run `command` (its output path is the placeholder {out}) once per content hash."""
    key = source_hash(" ".join(command))
    target = cache_dir() / key / name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / name
        result = subprocess.run([a.replace("{out}", str(out)) for a in command], capture_output=True,
                                text=True, cwd=CSRC)
        if result.returncode != 0:
            raise RuntimeError(f"building {name} failed:\n$ {' '.join(command)}\n{result.stdout}{result.stderr}")
        os.replace(out, target)
    return target


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/nvcc",):
        if os.path.exists(candidate):
            return candidate
    return None


def build_device_library(arch: str | None = None) -> Path:
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found: device mode builds its scheduler with the CUDA toolkit")
    return _compile("libblink_control.so", [
        nvcc, f"-arch={arch or cuda_arch()}", "-rdc=true", "-shared", "-Xcompiler", "-fPIC", "--cudart", "shared",
        "-O2", "-std=c++17", "-o", "{out}", str(CSRC / "scheduler.cu"), str(CSRC / "p2p_allreduce.cu"),
        "-lcudadevrt"])


def build_host_library() -> Path:
    """BLINK_HOST_CXXFLAGS adds flags, e.g. "-fsanitize=address,undefined" (tools/sanitize_scheduler.sh)."""
    cxx = os.environ.get("CXX", "g++")
    extra = os.environ.get("BLINK_HOST_CXXFLAGS", "").split()
    return _compile("libblink_sched_host.so", [
        cxx, "-O2", "-std=c++17", "-Wall", "-shared", "-fPIC", "-pthread", *extra, "-o", "{out}",
        str(CSRC / "host_api.cpp")])


def _declare(lib: C.CDLL, signatures: dict[str, tuple]) -> C.CDLL:
    for name, (restype, *argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


_P, _I, _U64 = C.c_void_p, C.c_int, C.c_uint64
_COMMON = {
    "blink_sched_state_bytes": (_U64, _P),
}


def load_host_library() -> C.CDLL:
    return _declare(C.CDLL(str(build_host_library())), {
        **_COMMON,
        "blink_sched_init": (None, _P, _P, _U64, _U64, _U64),
        "blink_sched_prepare": (_I, _P, _I),
        "blink_sched_complete": (None, _P, _I, _I, _I),
        "blink_sched_during_forward": (None, _P, _I, _I),
        "blink_sched_prepare_ahead": (_I, _P, _I),
        "blink_sched_take_ahead": (_I, _P, _I),
        "blink_sched_finish_behind": (_I, _P, _I),
        "blink_sched_launch": (None, _P),
        "blink_sched_complete_launched": (None, _P, _I, _I, _I),
        "blink_sched_ahead_counts": (None, _P, C.POINTER(C.c_uint64)),
        "blink_sched_publish": (None, _P),
        "blink_post_to_peers": (None, _P, _U64, C.c_uint32),
        "blink_sched_fail": (None, _P, C.c_int32),
        "blink_sched_check": (_I, _P, _P),
        "blink_graph_exec_index": (_I, _P, _I, _I, _I),
        "blink_sched_drain_done": (_I, _P),
        "blink_sched_info": (None, _P, C.POINTER(C.c_int64)),
        "blink_sched_plan": (None, _P, C.POINTER(C.c_int64)),
        "blink_block_hash": (_U64, _U64, _P, _I),
        "blink_block_key": (_U64, _U64),
        "blink_sched_idle_turn": (_I, _P, _P),
        "blink_sched_pace": (_U64, _P, _I, _U64),
        "blink_team_votes": (None, _I, _I, _P, _P, _I),
        "blink_ahead_row_check": (None, _P, _P, _I, C.c_int32, C.POINTER(C.c_int32)),
    })


def load_device_library(arch: str | None = None) -> C.CDLL:
    return _declare(C.CDLL(str(build_device_library(arch))), {
        **_COMMON,
        "blink_sched_init_device": (_I, _P, _P, _U64, _U64, _U64, _P),
        "blink_capture_step_done": (_I, _P, _P),
        "blink_done_counter": (_P, _P),
        "blink_host_register": (_I, _P, _U64),
        "blink_host_unregister": (_I, _P),
        "blink_host_device_pointer": (_I, _P, C.POINTER(_P)),
        "blink_stream_create": (_I, C.POINTER(_P)),
        "blink_stream_query": (_I, _P),
        "blink_stream_synchronize": (_I, _P),
        "blink_stream_destroy": (_I, _P),
        "blink_instantiate_device": (_I, _P, _P, C.POINTER(_P)),
        "blink_exec_destroy": (_I, _P),
        "blink_describe_graph": (_I, _P, C.POINTER(C.c_int)),
        "blink_loop_create": (_I, _P, _P, C.POINTER(_P)),
        "blink_loop_launch": (_I, _P, _P),
        "blink_follower_create": (_I, _P, _P, C.POINTER(_P)),
        "blink_follower_state_bytes": (_U64,),
        "blink_follower_done_counter": (_P, _P),
        "blink_enable_peer_access": (_I, _I),
        "blink_ipc_open": (_I, C.c_char_p, C.POINTER(_P)),
        "blink_ipc_close": (_I, _P),
        "blink_p2p_allreduce_bf16": (_I, _P, _I, _P, _P, C.c_int64, _P),
        "blink_p2p_allreduce_ll_bf16": (_I, _P, _I, _P, _P, C.c_int64, _P),
        "blink_p2p_params_bytes": (_U64,),
        "blink_p2p_params_layout": (None, _P),
        "blink_cuda_error_string": (C.c_char_p, _I),
    })
