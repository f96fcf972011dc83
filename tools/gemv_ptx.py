"""The one-row GEMV loop (blink/kernels/gemv.py) compiled for sm_90 on this CPU machine, against a git revision's.

Session 15 found the batch-1 step 10% slower (4.497 against 4.064 ms) after a change that only reordered the
one-row loop's Triton source (a load before a cast): the PTX had changed in the loop. This compares the PTX of
each prologue's default one-row kernel with a revision's, without a GPU, so a reorder shows before it is timed.

    python -m tools.gemv_ptx [--rev HEAD]
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from tests.kernels.sm90 import compile_sm90

ROOT = Path(__file__).resolve().parent.parent
# prologue: (N, K) of llama3-8b's projection behind it
SHAPES = {"none": (128256, 4096), "add_norm": (6144, 4096), "silu_mul": (4096, 14336)}
# debug info, DWARF offsets and the debug labels included (they move with a comment or a helper)
DEBUG = re.compile(r"\.loc|\.file|^\s*//|\.b8|\.b32 .*// (DW_|Length)|debug|\.section|\$L__tmp\d+")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def ptx(module, prologue: str) -> str:
    n, k = SHAPES[prologue]
    config = module.default_config(n, k, 1, prologue)
    fn = module._gemv_kernel
    pointers = {name: "*bf16" for name in fn.arg_names[:7]}
    constants = dict(PROLOGUE=module.PROLOGUES[prologue], HAS_BIAS=False, USE_PDL=True, BLOCK_M=1,
                     BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                     NORM_K=min(triton.next_power_of_2(k), max(config.block_k, 4096)))
    for name, value in (("PREFETCH", True), ("USE_DOT", False)):  # not in every revision's kernel
        if name in fn.arg_names:
            constants[name] = value
    # pointers, strides, N and K 16-divisible, as the JIT specializes llama3-8b's calls
    aligned = lambda name: name in pointers or name.startswith("stride") or name in ("N", "K")
    kernel = compile_sm90(fn, pointers, constants, aligned, lambda name: "fp32" if name == "eps" else "i32",
                          num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=True)
    return kernel.asm["ptx"]


def code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not DEBUG.search(line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD", help="git revision whose blink/kernels/gemv.py is the reference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / "gemv_reference.py"
        old_path.write_text(subprocess.run(["git", "show", f"{args.rev}:blink/kernels/gemv.py"], cwd=ROOT,
                                           check=True, capture_output=True, text=True).stdout)
        old, new = load(old_path, "gemv_reference"), load(ROOT / "blink/kernels/gemv.py", "gemv_working_tree")
        for prologue in SHAPES:
            a, b = code_lines(ptx(old, prologue)), code_lines(ptx(new, prologue))
            moved = len(set(a) ^ set(b))
            counts = {op: sum(op in line for line in b) for op in ("ld.global", "bar.sync", "shfl.sync", "fma.rn")}
            print(f"{prologue:<9} {args.rev}: {len(a)} lines, working tree: {len(b)} lines, {moved} lines only in "
                  f"one; working tree {counts}")


if __name__ == "__main__":
    main()
