"""Building blocks of the decoder: RMSNorm, the embedding and the two kinds of linear layer.

Linear layers are named for how tensor parallelism will split them (Megatron style): a column-parallel
layer splits its outputs across ranks (q|k|v, gate|up, lm_head), a row-parallel one its inputs (o_proj,
down_proj; its partial sums will need an all-reduce). tp_rank/tp_size are plumbed through so that shapes
and weight loading are already per rank; blink runs with tp_size=1 for now.

Parameters are created uninitialized, on the target device, in the target dtype, without autograd: they
are filled by blink.model.weights (from a checkpoint or at random), never trained.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blink.kernels import gemm_small_m, linear, rms_norm


def _empty_param(*shape: int, device, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)


def _check_shape(what: str, got: torch.Tensor, want: torch.Size) -> None:
    if got.shape != want:
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(got.shape)}, expected {tuple(want)}")


def _shard_size(size: int, tp_size: int, what: str) -> int:
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by the tensor-parallel size {tp_size}")
    return size // tp_size


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm; with `residual` it first adds it and returns (normed, new residual)."""

    def __init__(self, size: int, eps: float, device, dtype):
        super().__init__()
        self.eps = eps
        self.weight = _empty_param(size, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, device, dtype):
        super().__init__()
        self.weight = _empty_param(vocab_size, hidden_size, device=device, dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), where W stacks one or more HF projections ("parts") along its output rows.

    Fusing q|k|v or gate|up into one weight makes one GEMM out of several. `part_slices` says which output
    rows of this rank's weight hold each part; each part is split evenly across tensor-parallel ranks.
    """

    def __init__(self, in_features: int, part_sizes: dict[str, int], bias: bool, device, dtype,
                 tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.part_slices: dict[str, slice] = {}
        offset = 0
        for name, size in part_sizes.items():
            local = _shard_size(size, tp_size, name)
            self.part_slices[name] = slice(offset, offset + local)
            offset += local
        self.weight = _empty_param(offset, in_features, device=device, dtype=dtype)
        self.bias = _empty_param(offset, device=device, dtype=dtype) if bias else None
        self.small_m_gemm = gemm_small_m.enabled_by_env()  # Triton GEMM for <= 16 tokens instead of cuBLAS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.small_m_gemm)

    def load_hf(self, param_name: str, hf_tensor: torch.Tensor, part: str | None) -> None:
        """Copy this rank's rows of one HF projection (`part`; None if there is only one) into place."""
        if part is None:
            (part,) = self.part_slices
        rows = self.part_slices[part]
        local = rows.stop - rows.start
        full_shape = (local * self.tp_size, *getattr(self, param_name).shape[1:])
        _check_shape(f"{part}.{param_name}", hf_tensor, torch.Size(full_shape))
        getattr(self, param_name)[rows].copy_(hf_tensor.narrow(0, self.tp_rank * local, local))


class RowParallelLinear(nn.Module):
    """y = x W^T (+ b) where each rank holds a slice of W's input columns.

    With tp_size > 1 the outputs are partial sums that need an all-reduce (and the bias added once, after
    it); with tp_size == 1 this is a plain linear layer.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, device, dtype,
                 tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        local_in = _shard_size(in_features, tp_size, "input features")
        self.weight = _empty_param(out_features, local_in, device=device, dtype=dtype)
        self.bias = _empty_param(out_features, device=device, dtype=dtype) if bias else None
        self.small_m_gemm = gemm_small_m.enabled_by_env()  # Triton GEMM for <= 16 tokens instead of cuBLAS

    def forward(self, x: torch.Tensor, silu_mul_input: bool = False) -> torch.Tensor:
        """With silu_mul_input, x is a gate|up output: computes down(silu(gate) * up), fused when it can."""
        return linear(x, self.weight, self.bias, self.small_m_gemm, silu_mul_input)

    def load_hf(self, param_name: str, hf_tensor: torch.Tensor, part: str | None) -> None:
        param = getattr(self, param_name)
        if param_name == "bias":
            _check_shape("bias", hf_tensor, param.shape)
            param.copy_(hf_tensor)
            return
        local = param.shape[1]
        _check_shape("weight", hf_tensor, torch.Size((param.shape[0], local * self.tp_size)))
        param.copy_(hf_tensor.narrow(1, self.tp_rank * local, local))
