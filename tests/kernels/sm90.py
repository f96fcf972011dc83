"""Compiling Triton kernels for the H200 (sm_90) on a machine without a GPU, for the CPU tests.

The interpreter (used by the other CPU tests) accepts things the real compiler rejects (a tl.dot under a
branch, loop-carried types, input_precision); compiling for sm_90 closes that gap. The compile runs in a
fresh Python because the test session set TRITON_INTERPRET=1 before triton was imported.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_MEMORY_LIMIT = 232448  # an H100/H200 block gets at most 227 KB; only checked at launch on a GPU


def run_uninterpreted(argv: list[str], timeout: float) -> str:
    """`python argv` without TRITON_INTERPRET, from the repo root; asserts that it succeeded, returns its stdout."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, *argv], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def compile_sm90(fn, pointers: dict, constexprs: dict, aligned=lambda name: False, scalar=lambda name: "i32",
                 **options):
    """fn compiled for sm_90: `pointers` maps pointer arguments to their types, other arguments are
    `scalar(name)`; those `aligned(name)` says are marked 16-divisible, as the JIT specializes real calls
    (this is what turns on cp.async pipelining, so the shared-memory use checked here is realistic)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # a constexpr the caller leaves out takes its default (else it would compile as a runtime scalar)
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, scalar(name)) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if aligned(name) and name not in constexprs}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=options)
    assert kernel.metadata.shared <= SHARED_MEMORY_LIMIT, (fn.__name__, constexprs, options, kernel.metadata.shared)
    return kernel
