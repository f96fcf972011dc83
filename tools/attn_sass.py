"""The attention benches' variants compiled for sm_90 on this CPU machine: shared memory, registers, stack (where
ptxas spills), and what each KV loop issues per tile (from the SASS of Triton's own ptxas), so that a variant's cost
can be read before it is timed.

    python -m tools.attn_sass [--variants "today;exp2;..."] [--tokens 8192]     # prefill_attention.py's chunk tiles
    python -m tools.attn_sass --decode-batch 32 [--context 1024] [--variants "default;maxnreg 96"]
                                                                               # attention_variants.py's decode grids

llama3-8b's heads (32 q, 8 kv, head_dim 128), bf16, 16-token KV blocks (the prefill bench's block size for its
`-b64` / `-b128` variants): one sequence of --tokens tokens, or
--decode-batch sequences of one token at --context keys (the plan's tiles, splits and register cap for them).
Columns per loop: SASS instructions, MUFU.EX2, FMUL, FFMA, FADD, BAR.SYNC, LDGSTS (cp.async), HGMMA, and STL / LDL
(spills) inside the loop.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from bench.kernels.attention_variants import ATTENTION_VARIANTS, chosen_names
from bench.kernels.prefill_attention import BLOCK_SIZES, VARIANTS
from blink.kernels import attention
from blink.kernels.attention_merge import merge_chunk
from blink.kernels.attention_plan import launch_plan
from tests.kernels.sm90 import compile_sm90

OPS = ("MUFU.EX2", "FMUL", "FFMA", "FADD", "BAR.SYNC", "LDGSTS", "HGMMA", "STL", "LDL")
POINTERS = {**{name: "*bf16" for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")},
            **{name: "*fp32" for name in ("partial_ptr", "max_ptr", "sum_ptr")},
            **{name: "*i32" for name in ("query_start_loc_ptr", "seq_lens_ptr", "block_tables_ptr", "ticket_ptr")}}


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


def compile_variant(tuning, tokens: int, seqs: int = 1, kv_len: int | None = None, heads=(32, 8),
                    head_dim: int = 128, pdl: bool = False, block_size: int = 16):
    """One chunk of `tokens` (seqs 1), or `seqs` decode rows (tokens == seqs) at kv_len keys, as the plan runs it
    (pdl: launched with PDL, as on the H200 in the step), on KV blocks of block_size tokens."""
    plan = launch_plan(tokens, seqs, *heads, head_dim, kv_len or tokens, tuning)
    group = heads[0] // heads[1]
    merge = plan.num_splits > 1 and tuning.merge_in_kernel  # as attention.py with the runner's tickets (every tile's)
    constexprs = dict(GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_Q=plan.block_q,
                      BLOCK_N=plan.block_n, BLOCK_D=head_dim, BLOCK_S=triton.next_power_of_2(seqs),
                      NUM_SPLITS=plan.num_splits, PRECISION="tf32", USE_PDL=pdl, CAUSAL_SPLIT=plan.causal_split,
                      SPLIT_MIN_TILES=plan.split_min_tiles, SCALE_IN_EXP2=plan.scale_in_exp2,
                      LAZY_RESCALE=plan.lazy_rescale, PAGE=plan.page(block_size),
                      MERGE_CHUNK=merge_chunk(plan.num_splits, group, head_dim) if merge else 0,
                      EARLY_TABLE=plan.early_table, PREFETCH_KV=plan.early_table, PAGE_GATHER=plan.page_gather)
    aligned = lambda name: name in POINTERS or name.startswith("stride") or name in ("head_dim", "block_size")
    scalar = lambda name: "fp32" if name == "scale_log2" else "i32"
    cap = {"maxnreg": plan.maxnreg} if plan.maxnreg else {}
    return compile_sm90(attention._paged_attention_kernel, POINTERS, constexprs, aligned, scalar,
                        num_warps=plan.num_warps, num_stages=plan.num_stages, launch_pdl=pdl, **cap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=None, help="';'-separated names (default: all of the section's)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--decode-batch", type=int, default=0, help="decode rows (0: a prefill chunk of --tokens)")
    parser.add_argument("--context", type=int, default=1024, help="keys per decode row")
    args = parser.parse_args()
    table = ATTENTION_VARIANTS if args.decode_batch else VARIANTS
    names = chosen_names(parser, args.variants, table, "variants")
    shape = (args.decode_batch, args.decode_batch, args.context) if args.decode_batch else (args.tokens, 1, None)
    width = max(20, *map(len, names))
    print(f"{'variant':<{width}} {'smem':>7} {'regs':>4} {'stack':>5}  per loop: " + " ".join(["ins", *OPS]))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        for name in names:
            block_size = 16 if args.decode_batch else BLOCK_SIZES.get(name, 16)  # the bench's today-b128 and others
            kernel = compile_variant(table[name], *shape, block_size=block_size)
            cubin.write_bytes(kernel.asm["cubin"])
            usage = subprocess.run([_nvidia_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout
            regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
            sass = subprocess.run([_nvidia_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
            counts = ["/".join(str(loop[key]) for key in ("ins", *OPS)) for loop in loops(sass)]
            print(f"{name:<{width}} {kernel.metadata.shared:>7} {regs:>4} {stack:>5}  {'  '.join(counts)}", flush=True)


if __name__ == "__main__":
    main()
