"""tests/interpreter_patching.py: a helper called in a kernel's loop no longer re-patches triton.language, the
results stay the interpreter's, and the language is restored after the launch."""
import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")


@triton.jit
def _twice(x):
    return tl.sum(x, axis=0) * 2


@triton.jit
def _loop_of_helpers(x_ptr, out_ptr, N: tl.constexpr, TRIPS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    total = tl.zeros([1], dtype=tl.float32)
    for _ in range(TRIPS):
        total += _twice(x)
        total += tl.max(x, axis=0)  # triton's standard library: its own helpers, seen through tl.core
    tl.store(out_ptr + tl.arange(0, 1), total)


def test_helpers_in_a_loop_patch_the_language_once_per_launch(monkeypatch):
    from triton.runtime import interpreter

    calls = []
    patch_builtin = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: calls.append(a[0]) or patch_builtin(*a))
    x = torch.arange(16, dtype=torch.float32)
    out = torch.empty(1)
    patches = []
    for trips in (1, 5, 50):  # the first launch in a process patches a little less (Triton leaves tl.core patched)
        calls.clear()
        _loop_of_helpers[(1,)](x, out, N=16, TRIPS=trips)
        assert out.item() == trips * (2 * x.sum().item() + 15)
        patches.append(len(calls))
    # a launch patches a few modules once; without the wrapper every helper call patched four more (807 at 50 trips)
    assert patches[1] == patches[2] <= 12, patches
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.arange)  # the launch restored the language


@triton.jit
def _sort_descending(x_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, N), tl.sort(tl.load(x_ptr + tl.arange(0, N)), 0, descending=True))


def test_sort_through_the_numpy_xor_reduction_equals_torch():
    """tl.sort's bitonic network reduces with xor_sum, which the wrapper hands to NumPy: the order stays exact."""
    x = torch.randperm(256, generator=torch.Generator().manual_seed(0)).to(torch.int32) - 100
    out = torch.empty_like(x)
    _sort_descending[(1,)](x, out, N=256)
    assert torch.equal(out, torch.sort(x, descending=True).values)
