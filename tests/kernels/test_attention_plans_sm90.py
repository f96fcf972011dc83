"""Every attention launch the planner gives compiles for sm_90: the default tuning over KV block sizes 16-128, the
engine's step shapes (decode buckets, prefill chunks, mixed steps) and the models' head layouts.

test_compile_sm90.py builds hand-picked variants; this one builds what launch_plan actually chooses, through the
launcher's own constexprs (attention.kernel_meta). Session 34's GPU found `--block-size 128` failing to compile its
64-key chunk tiles with the page gather on, a combination no hand-picked variant had.
"""
import itertools

import pytest

from tests.kernels.sm90 import run_uninterpreted

pytestmark = pytest.mark.slow  # compiles for sm_90 in a subprocess

BLOCK_SIZES = (16, 32, 64, 128)
HEADS = ((32, 8), (40, 10), (64, 8))  # (q heads, KV heads), head_dim 128: llama3-8b, phi-4, qwen3-32b
# (tokens, sequences, longest KV): decode buckets, a lone chunk, chunks beside decodes, a chunk after a long prefix
SHAPES = [(s, s, kv) for s in (1, 2, 8, 32, 64, 256) for kv in (1024, 32768)] + \
    [(2048, 1, 2048), (2048, 1, 32768), (2048, 16, 8192), (512, 4, 4096), (64, 1, 32768), (16, 2, 1024)]


def plans() -> dict:
    """{(constexprs, options) as sorted tuples: the first shape that asked for it}."""
    from blink.kernels.attention import kernel_meta
    from blink.kernels.attention_plan import AttentionTuning, launch_plan

    tuning = AttentionTuning()
    found = {}
    for (tokens, seqs, kv), (hq, hkv), block in itertools.product(SHAPES, HEADS, BLOCK_SIZES):
        plan = launch_plan(tokens, seqs, hq, hkv, 128, -(-kv // block) * block, tuning, None)
        for merge in {False, plan.num_splits > 1 and tuning.merge_in_kernel}:
            constexprs, options = kernel_meta(plan, hq // hkv, 128, seqs, block, False, True, merge)
            found.setdefault((tuple(sorted(constexprs.items())), tuple(sorted(options.items()))),
                             (tokens, seqs, kv, hq, hkv, block, merge))
    return found


def _compile_all() -> None:
    from blink.kernels import attention
    from tests.kernels.sm90 import compile_sm90

    pointers = {**{n: "*bf16" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}, "partial_ptr": "*fp32",
                "max_ptr": "*fp32", "sum_ptr": "*fp32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
                "block_tables_ptr": "*i32", "ticket_ptr": "*i32"}
    aligned = lambda name: name in pointers or name.startswith("stride") or name in ("head_dim", "block_size")
    scalar = lambda name: "fp32" if name == "scale_log2" else "i32"
    found = plans()
    for (constexprs, options), shape in found.items():
        try:
            compile_sm90(attention._paged_attention_kernel, pointers, dict(constexprs), aligned, scalar,
                         launch_pdl=True, **dict(options))
        except Exception as e:  # name the step shape, not only Triton's trace
            raise AssertionError(f"(tokens, seqs, kv, hq, hkv, block, merge) = {shape}: {dict(constexprs)}") from e
    print(f"{len(found)} distinct attention launches compiled")


def test_every_planned_attention_launch_compiles_for_sm90():
    out = run_uninterpreted([__file__], timeout=900)
    assert int(out.split()[0]) >= 20, out  # the grid reaches many distinct plans, or it tests little


if __name__ == "__main__":
    _compile_all()
