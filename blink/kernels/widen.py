"""A GEMM's bf16 / fp16 output widened to fp32: the LM head's logits where cuBLAS runs it (above the GEMV's rows).

torch's `.to(torch.float32)` takes its casting copy, one element a thread without vector loads: on the H200 it
spent 22.4 / 46.6 us a step on 32 / 64 rows of Llama-3's 128k logits (session 19's timeline), about a quarter of
the copy rate. This kernel reads 16-byte vectors, so it streams. The values are the same bits (widening is exact).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blink.kernels.pdl import pdl_for, pdl_wait

BLOCK = 4096  # elements a program: 32 a thread at 4 warps, four 16-byte loads each


@triton.jit
def _widen_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask).to(tl.float32), mask=mask)


def widen_triton(x: torch.Tensor) -> torch.Tensor:
    """x (contiguous, bf16 or fp16) as a new fp32 tensor of its shape."""
    assert x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    use_pdl = pdl_for(x)
    _widen_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK, USE_PDL=use_pdl,
                                                     launch_pdl=use_pdl)
    return out
