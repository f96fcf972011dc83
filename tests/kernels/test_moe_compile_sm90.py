"""Compile the MoE kernels for the H200 (sm_90) without a GPU, as test_compile_sm90.py does for the others:
the interpreter accepts things the real compiler rejects (a tl.dot under a branch, input_precision)."""
import pytest

from tests.kernels.sm90 import compile_sm90, run_uninterpreted

_MULTIPLES_OF_16 = ("n_out", "k_dim", "H", "I")
pytestmark = pytest.mark.slow  # spawns the compiler in a subprocess


def _compile_all() -> None:
    from blink.kernels import moe, moe_gemm, moe_gemv

    def check(fn, pointers: dict, constexprs: dict, **options):
        aligned = lambda name: name in pointers or name.startswith("stride") or name in _MULTIPLES_OF_16
        scalar = lambda name: "fp32" if name == "eps" else "i32"
        compile_sm90(fn, pointers, constexprs, aligned, scalar, **options)

    for renorm in (False, True):  # 128 experts, top 8 (Qwen3-30B-A3B); 8, top 2 (Mixtral)
        for block_e, top_k in ((128, 8), (8, 2)):
            check(moe._route_kernel, {"logits_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32"},
                  dict(TOP_K=top_k, RENORM=renorm, BLOCK_E=block_e, BLOCK_K=top_k))
    for block_m, block_e in ((16, 128), (64, 128), (16, 8)):
        check(moe._align_kernel, {"ids_ptr": "*i32", "sorted_ptr": "*i32", "block_expert_ptr": "*i32"},
              dict(BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=max(16, min(256, 16384 // block_e))), num_warps=8)
    for dtype, precision in (("*bf16", "tf32"), ("*fp32", "ieee")):
        ptrs = {"a_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "sorted_ptr": "*i32",
                "block_expert_ptr": "*i32", "weights_ptr": "*fp32"}
        for gated, weighted in ((True, False), (False, True)):
            for block_m, block_n in ((16, 32), (16, 64), (64, 64)):
                check(moe_gemm._grouped_gemm_kernel, ptrs,
                      dict(TOP_K=8, GATED=gated, WEIGHTED=weighted, PRECISION=precision, BLOCK_M=block_m,
                           BLOCK_N=block_n, BLOCK_K=64))
    # the decode streams (moe_gemv.py) at Qwen3-30B-A3B's batch 1 / 8 tiles, and a narrow and a wide one
    streams = {"x_ptr": "*bf16", "nw_ptr": "*bf16", "w13_ptr": "*bf16", "w2_ptr": "*bf16", "act_ptr": "*bf16",
               "out_ptr": "*bf16", "ids_ptr": "*i32", "weights_ptr": "*fp32"}
    configs = {moe_gemv.default_config(768, 2048, 8), moe_gemv.default_config(768, 2048, 64),
               moe_gemv.default_config(2048, 768, 1), moe_gemv.default_config(2048, 768, 8),
               moe_gemv.MoeGemvConfig(2, 2048), moe_gemv.MoeGemvConfig(16, 256)}
    for cfg in sorted(configs, key=str):
        for top_k in (8, 2):
            for fn, extra in ((moe_gemv._gate_up_kernel, dict(NORM=False)), (moe_gemv._gate_up_kernel,
                              dict(NORM=True, NORM_K=2048)), (moe_gemv._down_kernel, {})):
                check(fn, {name: streams[name] for name in fn.arg_names if name in streams},
                      dict(TOP_K=top_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, **extra), num_warps=cfg.num_warps,
                      num_stages=cfg.num_stages)


def test_moe_kernels_compile_for_sm90():
    run_uninterpreted([__file__], timeout=500)


if __name__ == "__main__":
    _compile_all()
