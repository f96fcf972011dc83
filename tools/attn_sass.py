"""The prefill-attention bench's variants (bench/kernels/prefill_attention.py) compiled for sm_90 on this CPU machine:
shared memory, registers, spills, and what each KV loop of the chunk kernel issues per tile (from the SASS of
Triton's own ptxas), so that a variant's cost can be read before it is timed.

    python -m tools.attn_sass [--variants today,exp2,...] [--tokens 8192]

llama3-8b's heads (32 q, 8 kv, head_dim 128), bf16, 16-token KV blocks, one sequence of --tokens tokens (the plan's
tiles for it).
Columns per loop (unmasked, then masked): SASS instructions, MUFU.EX2, FMUL, FFMA, FADD, BAR.SYNC, LDGSTS (cp.async),
HGMMA, and STL / LDL (spills) inside the loop.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from bench.kernels.prefill_attention import VARIANTS
from blink.kernels import attention
from blink.kernels.attention_plan import launch_plan
from tests.kernels.sm90 import compile_sm90

OPS = ("MUFU.EX2", "FMUL", "FFMA", "FADD", "BAR.SYNC", "LDGSTS", "HGMMA", "STL", "LDL")
POINTERS = {**{name: "*bf16" for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")},
            **{name: "*fp32" for name in ("partial_ptr", "max_ptr", "sum_ptr")},
            **{name: "*i32" for name in ("query_start_loc_ptr", "seq_lens_ptr", "block_tables_ptr")}}


def _nvidia_tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def loops(sass: str) -> list[dict]:
    """Per backward branch (a loop), the counts of OPS between its target label and the branch."""
    labels, ins = {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
        elif code := re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            ins.append(code.group(1))
    found = []
    for i, text in enumerate(ins):
        target = re.search(r"BRA.*\.(L_x_\d+)", text)
        if target and labels.get(target.group(1), i) < i:
            body = ins[labels[target.group(1)]:i + 1]
            found.append({"ins": len(body), **{op: sum(op in x for x in body) for op in OPS}})
    return found


def compile_variant(tuning, tokens: int, heads=(32, 8), head_dim: int = 128):
    plan = launch_plan(tokens, 1, *heads, head_dim, tokens, tuning)
    group = heads[0] // heads[1]
    constexprs = dict(GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_Q=plan.block_q,
                      BLOCK_N=plan.block_n, BLOCK_D=head_dim, BLOCK_S=1, NUM_SPLITS=plan.num_splits,
                      PRECISION="tf32", USE_PDL=False, CAUSAL_SPLIT=plan.causal_split, SPLIT_MIN_TILES=0,
                      SCALE_IN_EXP2=plan.scale_in_exp2, LAZY_RESCALE=plan.lazy_rescale, PAGE=plan.page(16))
    aligned = lambda name: name in POINTERS or name.startswith("stride") or name in ("head_dim", "block_size")
    scalar = lambda name: "fp32" if name == "scale_log2" else "i32"
    return compile_sm90(attention._paged_attention_kernel, POINTERS, constexprs, aligned, scalar,
                        num_warps=plan.num_warps, num_stages=plan.num_stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    print(f"{'variant':<20} {'smem':>7} {'regs':>4}  per loop: " + " ".join(["ins", *OPS]))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        for name in args.variants.split(","):
            kernel = compile_variant(VARIANTS[name], args.tokens)
            cubin.write_bytes(kernel.asm["cubin"])
            usage = subprocess.run([_nvidia_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout
            regs = re.search(r"REG:(\d+)", usage).group(1)
            sass = subprocess.run([_nvidia_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
            counts = ["/".join(str(loop[key]) for key in ("ins", *OPS)) for loop in loops(sass)]
            print(f"{name:<20} {kernel.metadata.shared:>7} {regs:>4}  {'  '.join(counts)}", flush=True)


if __name__ == "__main__":
    main()
