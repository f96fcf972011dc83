"""SiLU-and-mul for the gated MLP: silu(x[:, :I]) * x[:, I:], computed in fp32, stored in x's dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from blink.kernels.pdl import pdl_for, pdl_wait


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    return (F.silu(x[..., :inter].float()) * x[..., inter:].float()).to(x.dtype)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, inter, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * inter + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    assert x.dim() == 2 and x.stride(-1) == 1
    tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(inter))
    use_pdl = pdl_for(x)
    _silu_and_mul_kernel[(tokens, triton.cdiv(inter, block))](x, out, x.stride(0), inter, BLOCK=block,
                                                              USE_PDL=use_pdl, launch_pdl=use_pdl)
    return out
