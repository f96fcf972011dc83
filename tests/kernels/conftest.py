"""Kernel-test set-up: make Triton 3.6's interpreter work with NumPy >= 2.4.

The interpreter stores scalars as 1-element arrays and converts them with int(array), which NumPy 2.4 turned
into a TypeError; any loop with a data-dependent bound (`for i in range(start, end)`) then fails. We wrap
the interpreter's tensor patching so __index__ takes the element explicitly. Harmless on a GPU (the
interpreter is not used there) and with older NumPy.
"""
import triton.runtime.interpreter as interpreter

_original_patch_lang_tensor = interpreter._patch_lang_tensor


def _patch_lang_tensor_numpy24(tensor, scope):
    _original_patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


if getattr(interpreter._patch_lang_tensor, "__name__", "") != _patch_lang_tensor_numpy24.__name__:
    interpreter._patch_lang_tensor = _patch_lang_tensor_numpy24
