"""Compile every kernel for the H200 (sm_90) without a GPU, so code-generation errors show up in CPU CI.

The interpreter (used by the other CPU tests) accepts things the real compiler rejects; this closes that gap.
It runs in a subprocess because the test session has TRITON_INTERPRET=1 set before triton was imported.
"""
import itertools
import os

import pytest

from tests.kernels.sm90 import compile_sm90, run_uninterpreted

pytestmark = pytest.mark.slow  # spawns processes

_MULTIPLES_OF_16 = ("head_dim", "block_size", "hidden", "inter", "K", "N", "num_q_heads", "numel")


def _compile_all() -> None:
    from blink.kernels import (
        activation,
        attention,
        attention_merge,
        gemv,
        gemv_rope,
        gemv_rows,
        kv_write,
        rmsnorm,
        rope,
        widen,
    )
    from blink.kernels.attention_merge import merge_chunk

    def check(fn, pointers: dict, constexprs: dict, pdl: bool = False, **options):
        if "USE_PDL" in fn.arg_names:  # the PDL variant must wait on the previous kernel (pdl.py)
            constexprs, options = {**constexprs, "USE_PDL": pdl}, {**options, "launch_pdl": pdl}
        scalar = lambda name: "fp32" if name in ("scale_log2", "eps") else "i32"
        # 16-byte aligned pointers, strides and sizes divisible by 16, as the JIT specializes real calls
        aligned = lambda name: name in pointers or name.startswith("stride") or name in _MULTIPLES_OF_16
        kernel = compile_sm90(fn, pointers, constexprs, aligned, scalar, **options)
        assert ("griddepcontrol.wait" in kernel.asm["ptx"]) == pdl, (fn.__name__, pdl)
        if os.environ.get("BLINK_PRINT_SMEM"):
            print(fn.__name__, constexprs, options, kernel.metadata.shared, kernel.metadata.num_warps)
        return kernel

    bf16 = lambda *names: {name: "*bf16" for name in names}
    attention_ptrs = {**bf16("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"), "partial_ptr": "*fp32",
                      "max_ptr": "*fp32", "sum_ptr": "*fp32", "query_start_loc_ptr": "*i32",
                      "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32", "ticket_ptr": "*i32"}
    # chunk tiles' loop variants (attention_tile.py); the split merge by a second kernel; no early table (its own
    # test: test_attention_early_table.py)
    off = dict(SCALE_IN_EXP2=False, LAZY_RESCALE=0.0, PAGE=0, MERGE_CHUNK=0, EARLY_TABLE=False, PREFETCH_KV=False)

    def merges_in_kernel(kernel):  # attention_merge.py: a CTA barrier, then the acq_rel ticket at GPU scope
        ptx = kernel.asm["ptx"]
        ticket = next(i for i, line in enumerate(ptx.splitlines()) if "atom" in line and "acq_rel" in line)
        assert ".gpu" in ptx.splitlines()[ticket] and "bar.sync" in "\n".join(ptx.splitlines()[ticket - 12:ticket])

    configs = [(4, 4, 4, 128, 1), (4, 4, 16, 128, 1), (8, 8, 2, 128, 4), (1, 1, 64, 64, 1),
               (7, 8, 2, 128, 16), (2, 2, 32, 256, 1)]  # (group, padded group, BLOCK_Q, BLOCK_D, splits)
    for group, group_pad, block_q, block_d, splits in configs:
        tunings = [(64, 4, 3), (32, 4, 2), (128, 8, 3)] if block_d <= 128 else [(32, 4, 3)]  # default + bench
        for (block_n, num_warps, num_stages), merge in itertools.product(tunings, {False, splits > 1}):
            kernel = check(attention._paged_attention_kernel, attention_ptrs,
                           dict(GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n, BLOCK_D=block_d,
                                BLOCK_S=1 if splits == 16 else 64, NUM_SPLITS=splits, PRECISION="tf32",
                                CAUSAL_SPLIT=False, SPLIT_MIN_TILES=0,
                                **dict(off, MERGE_CHUNK=merge_chunk(splits, group, block_d) if merge else 0)),
                           num_warps=num_warps, num_stages=num_stages, pdl=splits == 16)
            if merge:
                merges_in_kernel(kernel)
    # Decode splits chosen in the kernel (split_min_tiles): batch 1's 32-position tiles over a 64 / 128 split grid,
    # batch 8's 64-position tiles over 16; each early-exiting program must still wait (PDL)
    for block_s, splits, block_n, min_tiles in [(1, 64, 32, 4), (1, 128, 32, 8), (8, 16, 64, 2)]:
        merges_in_kernel(check(attention._paged_attention_kernel, attention_ptrs,
                               dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=4, BLOCK_N=block_n, BLOCK_D=128, BLOCK_S=block_s,
                                    NUM_SPLITS=splits, PRECISION="tf32", CAUSAL_SPLIT=False,
                                    SPLIT_MIN_TILES=min_tiles, **dict(off, MERGE_CHUNK=merge_chunk(splits, 4, 128))),
                               num_warps=4, num_stages=2, pdl=True))
    # Session 18's opt-in decode variants: the KV block size compiled in, and with it the scale in exp2; a block of
    # whole tiles (64 / 128 tokens: one table entry a tile) at batch 1's 32-key tiles
    for block_n, loop in ((64, dict(off, PAGE=16)), (64, dict(off, PAGE=16, SCALE_IN_EXP2=True)),
                          (32, dict(off, PAGE=128)), (64, dict(off, PAGE=64)),
                          (64, dict(off, PAGE=16, PAGE_GATHER=True)),  # session 31: a tile's entries at once
                          (32, dict(off, PAGE=128, PAGE_GATHER=True))):  # a block over the tile: its one entry
        check(attention._paged_attention_kernel, attention_ptrs,
              dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=4, BLOCK_N=block_n, BLOCK_D=128, BLOCK_S=8, NUM_SPLITS=4,
                   PRECISION="tf32", CAUSAL_SPLIT=False, SPLIT_MIN_TILES=0, **loop),
              num_warps=4, num_stages=2, pdl=True)
    # Chunk tiles with the causal split (unmasked loop, then the diagonal): today's 64 rows, the sweep's 128 rows, and
    # session 17's variants (deeper pipelines: K/V 2-3 tiles ahead in up to 225 KB; the scale in exp2; lazy rescaling;
    # the KV block size compiled in)
    exp2, lazy = dict(off, SCALE_IN_EXP2=True, PAGE=16), dict(off, SCALE_IN_EXP2=True, LAZY_RESCALE=8.0, PAGE=16)
    for block_q, splits, block_n, num_warps, num_stages, loop in [
            (16, 1, 64, 4, 3, off), (32, 1, 64, 8, 3, off), (32, 1, 128, 8, 2, off), (32, 4, 64, 8, 2, off),
            (16, 1, 128, 4, 2, off), (32, 1, 128, 8, 5, off), (32, 1, 64, 8, 7, off), (32, 1, 128, 8, 2, exp2),
            (32, 2, 128, 8, 2, lazy), (32, 1, 128, 8, 5, lazy), (16, 1, 64, 4, 3, dict(off, LAZY_RESCALE=0.5)),
            (64, 1, 64, 16, 3, off), (32, 1, 64, 8, 7, exp2), (16, 1, 64, 4, 3, dict(off, PAGE=64)),
            (32, 1, 128, 8, 5, dict(exp2, PAGE_GATHER=True)),
            # the gather on by default (session 33) with a block over the tile (--block-size 128, 64-key chunk tiles):
            # the block's one-entry path; session 34's GPU failed to compile it (a constexpr branch's early return
            # does not end the function in Triton 3.6, so the gather below it was compiled with 0 entries)
            (16, 1, 64, 4, 3, dict(off, PAGE=128, PAGE_GATHER=True))]:
        check(attention._paged_attention_kernel, attention_ptrs,
              dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=block_q, BLOCK_N=block_n, BLOCK_D=128, BLOCK_S=64, NUM_SPLITS=splits,
                   PRECISION="tf32", CAUSAL_SPLIT=True, SPLIT_MIN_TILES=0, **loop), num_warps=num_warps,
              num_stages=num_stages)
    for splits in (4, 64, 128):  # the dynamic grid's merge reads up to 128 maxima per row
        check(attention_merge._merge_splits_kernel,
              {"partial_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32", "out_ptr": "*bf16",
               "query_start_loc_ptr": "*i32"}, dict(NUM_SPLITS=splits, BLOCK_D=128), pdl=True)
    check(kv_write._write_kv_kernel, {**bf16("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"),
                                      "slot_mapping_ptr": "*i64"}, dict(BLOCK_HEADS=8, BLOCK_D=128))
    norm_ptrs = bf16("x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "sum_ptr")
    for has_residual, rows, hidden in [(True, 1, 4096), (False, 1, 4096), (False, 16, 128)]:
        check(rmsnorm._rms_norm_kernel, norm_ptrs,
              dict(HAS_RESIDUAL=has_residual, BLOCK_ROWS=rows, BLOCK_H=hidden), pdl=has_residual)
    check(rope._rope_kernel, {**bf16("q_ptr", "k_ptr"), "positions_ptr": "*i64", "cos_sin_ptr": "*fp32"},
          dict(BLOCK_QH=32, BLOCK_KH=8, BLOCK_HALF=64))
    check(activation._silu_and_mul_kernel, bf16("x_ptr", "out_ptr"), dict(BLOCK=1024), pdl=True)
    for pdl in (False, True):  # the logits' widening (widen.py): 16-byte loads
        assert "ld.global.v4" in check(widen._widen_kernel, {"src_ptr": "*bf16", "dst_ptr": "*fp32"},
                                       dict(BLOCK=widen.BLOCK), pdl=pdl).asm["ptx"]
    fused_ptrs = {**bf16("q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "q_norm_ptr", "k_norm_ptr"),
                  "positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_mapping_ptr": "*i64"}
    for has_norm in (False, True):
        check(rope._rope_and_write_kv_kernel, fused_ptrs,
              dict(HAS_NORM=has_norm, BLOCK_QH=32, BLOCK_KH=8, BLOCK_HALF=64), pdl=has_norm)
    gemv_ptrs = bf16("x_ptr", "r_ptr", "nw_ptr", "w_ptr", "bias_ptr", "out_ptr", "new_r_ptr")
    for prologue, pdl in [(0, False), (1, True), (2, True), (3, False), (3, True)]:  # the one-row loop
        for block_n, block_k, num_warps in [(8, 512, 4), (4, 1024, 8), (16, 256, 4), (32, 128, 4)]:
            kernel = check(gemv._gemv_kernel, gemv_ptrs, dict(PROLOGUE=prologue, HAS_BIAS=prologue == 0,
                           BLOCK_M=1, BLOCK_N=block_n, BLOCK_K=block_k, NORM_K=4096, PREFETCH=True), pdl=pdl,
                           num_warps=num_warps, num_stages=1)
            # the weight loop (the last loop) reduces nothing across threads: no shuffle in it
            assert "shfl.sync" not in _last_loop(kernel.asm["ptx"]), (prologue, block_n, block_k)
    # 2-16 rows on tensor cores (gemv_rows.py): (prologue, SiLU-mul epilogue, PDL), default_config's tiles and the
    # bench's; the epilogue streams two W tiles a step
    for prologue, silu_out, pdl in [(2, True, True), (2, False, True), (1, True, False), (3, False, True),
                                    (0, False, False)]:
        tiles = [(32, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3)] if silu_out else \
            [(32, 512, 4, 3), (32, 256, 4, 4), (64, 128, 4, 4), (16, 256, 4, 1)]
        for block_n, block_k, num_warps, num_stages in tiles:
            check(gemv_rows._gemv_rows_kernel, gemv_ptrs, dict(PROLOGUE=prologue, SILU_OUT=silu_out,
                  HAS_BIAS=prologue == 0, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k), pdl=pdl,
                  num_warps=num_warps, num_stages=num_stages)
    # qkv with RoPE and the KV write in its epilogue (gemv_rope.py): llama3-8b's heads, the tiles gemv_rows takes
    rope_ptrs = {**gemv_ptrs, "cos_sin_ptr": "*fp32", "positions_ptr": "*i64", "slots_ptr": "*i64",
                 "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16"}
    for prologue, block_n, block_k, num_stages, pdl in [(2, 64, 256, 3, True), (2, 32, 512, 3, True),
                                                        (1, 128, 128, 3, False), (0, 64, 256, 3, True)]:
        kernel = check(gemv_rope._gemv_rope_kv_kernel, rope_ptrs,
                       dict(PROLOGUE=prologue, HAS_BIAS=prologue == 0, HEAD_DIM=128, Q_HEADS=32, KV_HEADS=8, BLOCK_M=16,
                            BLOCK_N=block_n, BLOCK_K=block_k), pdl=pdl, num_warps=4, num_stages=num_stages)
        assert "cp.async" in kernel.asm["ptx"]  # the weight loop stays pipelined inside the shared helper
    # and one row on gemv.py's CUDA-core loop: default_config's 4 columns (2 pairs) and a whole-head tile
    for prologue, block_n, block_k, pdl in [(2, 4, 1024, True), (1, 4, 1024, True), (0, 128, 32, False)]:
        kernel = check(gemv_rope._gemv_rope_kv_one_row_kernel, rope_ptrs,
                       dict(PROLOGUE=prologue, HAS_BIAS=prologue == 0, HEAD_DIM=128, Q_HEADS=32, KV_HEADS=8,
                            BLOCK_N=block_n, BLOCK_K=block_k, NORM_K=4096, PREFETCH=True), pdl=pdl, num_warps=4,
                       num_stages=1)
        ptx = kernel.asm["ptx"]
        assert "shfl.sync" not in _last_loop(ptx), (prologue, block_n)  # as the one-row GEMV's weight loop
        if pdl:  # the first W tile is in flight before the wait, as in gemv.py
            assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait"), prologue


def _last_loop(ptx: str) -> str:
    """The PTX of the last loop: from the last label that a later branch jumps back to, to that branch."""
    lines, labels, loops = ptx.splitlines(), {}, []
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith("$L") and ":" in text:
            labels[text.split(":")[0]] = i
        elif " bra" in f" {text}" and text.split()[-1].rstrip(";") in labels:
            loops.append("\n".join(lines[labels[text.split()[-1].rstrip(";")]:i]))
    assert loops, "no loop in the PTX"
    return loops[-1]


def test_kernels_compile_for_sm90():
    run_uninterpreted([__file__], timeout=500)


if __name__ == "__main__":
    _compile_all()
