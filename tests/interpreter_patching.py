"""Triton's interpreter, minus costs that are pure overhead (CI's time in the sampler tests, cProfile 2026-12-04):

- it patches `triton.language` for a launch, then again at every call of a @triton.jit helper inside it
  (inspect.getmembers over the language, ~0.25 ms a call). The second patch finds the builtins patched already
  and changes nothing, and Triton drops its scope unrestored; the sampler's kernels call helpers in their loops.
  Here a helper's patch is skipped when the running launch has patched the same language modules;
- tl.sort's bitonic network reduces with xor_sum, which the interpreter runs element by element in Python: here
  one NumPy reduction (xor is exact in any order);
- the Triton-to-NumPy dtype map is rebuilt on every lookup: here it is cached.

Everything else is Triton's own code, and a launch still restores the language when it ends. Used by conftest.py
under TRITON_INTERPRET=1 only."""
from __future__ import annotations

import inspect

import numpy as np


def language_modules(fn) -> frozenset[int]:
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


INTERNALS = ("_patch_lang", "_LangPatchScope", "GridExecutor", "ReduceOps", "_get_np_dtype")


def install() -> bool:
    """Wrap the interpreter's patching; False (and nothing changed) where its internals are not the expected."""
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, name) for name in INTERNALS):
        return False
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    running: list[frozenset[int] | None] = []  # per launch in progress: the modules it patched (None: not yet)
    modules_of: dict = {}  # jit function -> its language modules (its module's imports: read once)

    def patch_once(fn):
        modules = modules_of.get(fn)
        if modules is None:
            modules = modules_of[fn] = language_modules(fn)
        if running and running[-1] is not None and modules <= running[-1]:
            return interpreter._LangPatchScope()  # a helper inside a launch that patched these modules
        scope = patch_lang(fn)
        if running:  # the launch's own patch, or a helper's from modules the launch had not patched (triton's
            running[-1] = modules | (running[-1] or frozenset())  # standard library sees tl.core, not tl)
        return scope

    def launch_tracked(self, *args, **kwargs):
        running.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_tracked
    _fast_xor_reduce(interpreter)
    _cached_np_dtype(interpreter)
    return True


def _fast_xor_reduce(interpreter) -> None:
    import triton.language as tl

    apply_impl = interpreter.ReduceOps.apply_impl

    def apply_with_xor(self, input):
        if self.combine_fn == tl.standard._xor_combine:  # exact in any order: one NumPy reduction
            data = input[0].handle.data
            return self.to_tensor(np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims), input[0].dtype)
        return apply_impl(self, input)

    interpreter.ReduceOps.apply_impl = apply_with_xor


def _cached_np_dtype(interpreter) -> None:
    get_np_dtype, known = interpreter._get_np_dtype, {}

    def cached(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = found = get_np_dtype(tt_dtype)
            return found
        except TypeError:  # pointer types are not hashable
            return get_np_dtype(tt_dtype)

    interpreter._get_np_dtype = cached
