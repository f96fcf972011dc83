"""Building blocks of the decoder: RMSNorm, the vocab-parallel embedding / LM head and the two kinds of
tensor-parallel linear layer (Megatron style).

A column-parallel layer splits its outputs across ranks (q|k|v, gate|up), a row-parallel one its inputs
(o_proj, down_proj) and all-reduces its partial sums; the embedding and the LM head split the vocabulary.
`tp` is the rank's TPGroup (blink/parallel/group.py: rank, size, all_reduce, all_gather) or None for a
single rank; collectives go through it so that nothing here holds global state.

Parameters are created uninitialized, on the target device, in the target dtype, without autograd: they
are filled by blink.model.weights (from a checkpoint or at random), never trained. load_hf takes either a
tensor or a safetensors slice (safe_open(...).get_slice) and reads only this rank's rows or columns.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blink.kernels import linear, norm_linear, rms_norm, silu_epilogue_takes
from blink.kernels.gemv import GemvPlan


def _empty_param(*shape: int, device, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)


def source_shape(src) -> tuple[int, ...]:
    """Shape of a tensor or of a safetensors slice (which has get_shape() instead of .shape)."""
    return tuple(src.shape) if isinstance(src, torch.Tensor) else tuple(src.get_shape())


def read_all(src) -> torch.Tensor:
    return src if isinstance(src, torch.Tensor) else src[:]


def _check_shape(what: str, got, want) -> None:
    if source_shape(got) != tuple(want):
        raise ValueError(f"{what}: checkpoint tensor has shape {source_shape(got)}, expected {tuple(want)}")


def _shard_size(size: int, shards: int, what: str) -> int:
    if size % shards:
        raise ValueError(f"{what} ({size}) is not divisible by the tensor-parallel size {shards}")
    return size // shards


def _rank_size(tp) -> tuple[int, int]:
    return (0, 1) if tp is None else (tp.rank, tp.size)


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm; with `residual` it first adds it and returns (normed, new residual)."""

    def __init__(self, size: int, eps: float, device, dtype):
        super().__init__()
        self.eps = eps
        self.weight = _empty_param(size, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds ceil(vocab / tp) consecutive rows (the last rank's tail is zero padding).

    As an embedding, a rank looks up only the ids in its range (zeros elsewhere) and the all-reduce sums
    the ranks' rows into the full lookup. As the LM head (logits), each rank computes its vocabulary
    shard and the all-gather concatenates the shards, so every rank holds identical full logits.
    """

    def __init__(self, vocab_size: int, hidden_size: int, device, dtype, tp=None):
        super().__init__()
        self.tp = tp
        self.tp_rank, self.tp_size = _rank_size(tp)
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.weight = _empty_param(self.rows_per_rank, hidden_size, device=device, dtype=dtype)
        self.gemv: GemvPlan | None = None  # set at load time by blink/model/fusion.py

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.rows_per_rank)
        out = F.embedding(torch.where(mine, local, 0), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32, the same on every rank."""
        local = linear(hidden, self.weight, None, gemv=self.gemv, out_dtype=torch.float32)
        if self.tp_size == 1:
            return local
        return self.tp.all_gather(local)[:, : self.vocab_size]

    def load_hf(self, param_name: str, hf_tensor, part: str | None) -> None:
        _check_shape(param_name, hf_tensor, (self.vocab_size, self.weight.shape[1]))
        stop = min(self.vocab_start + self.rows_per_rank, self.vocab_size)
        real = max(0, stop - self.vocab_start)
        self.weight[real:].zero_()
        if real:
            self.weight[:real].copy_(hf_tensor[self.vocab_start:stop])


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), where W stacks one or more HF projections ("parts") along its output rows.

    Fusing q|k|v or gate|up into one weight makes one GEMM out of several. `part_slices` says which output
    rows of this rank's weight hold each part. A part is cut into `part_shards[part]` shards (default
    tp_size); with fewer shards than ranks (KV heads < tp) consecutive ranks share a shard (replication).
    """

    def __init__(self, in_features: int, part_sizes: dict[str, int], bias: bool, device, dtype,
                 tp=None, part_shards: dict[str, int] | None = None):
        super().__init__()
        self.tp_rank, self.tp_size = _rank_size(tp)
        self.part_slices: dict[str, slice] = {}
        self.part_offsets: dict[str, int] = {}  # first HF row of this rank's shard of each part
        offset = 0
        for name, size in part_sizes.items():
            shards = (part_shards or {}).get(name, self.tp_size)
            local = _shard_size(size, shards, name)
            self.part_slices[name] = slice(offset, offset + local)
            self.part_offsets[name] = self.tp_rank // (self.tp_size // shards) * local
            offset += local
        self.full_sizes = dict(part_sizes)
        self.weight = _empty_param(offset, in_features, device=device, dtype=dtype)
        self.bias = _empty_param(offset, device=device, dtype=dtype) if bias else None
        self.gemv: GemvPlan | None = None  # set at load time by blink/model/fusion.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, gemv=self.gemv)

    def normed(self, x: torch.Tensor, norm: RMSNorm, residual: torch.Tensor | None = None, silu_mul_out: bool = False):
        """self(norm(x [+ residual])), the norm fused into the GEMV where it runs. Returns (y, new residual
        or None). Column-parallel inputs are replicated, so the norm is the same on every rank. silu_mul_out
        (gate|up): y is silu(gate) * up of this rank's shard."""
        return norm_linear(x, norm.weight, norm.eps, self.weight, self.bias, residual, self.gemv, silu_mul_out)

    def fuses_silu_mul(self, x: torch.Tensor) -> bool:
        """Whether this gate|up's GEMV applies the SiLU-mul in its epilogue for x (shapes only: graph-safe)."""
        return silu_epilogue_takes(x, self.weight, self.gemv)

    def load_hf(self, param_name: str, hf_tensor, part: str | None) -> None:
        """Copy this rank's rows of one HF projection (`part`) into place. part None: the tensor holds every
        part, stacked in order (Phi-3's qkv_proj and gate_up_proj are fused in the checkpoint too)."""
        param = getattr(self, param_name)
        if part is None:
            _check_shape(param_name, hf_tensor, (sum(self.full_sizes.values()), *param.shape[1:]))
        base = 0
        for name, rows in self.part_slices.items():
            if part is None or name == part:
                if part is not None:
                    _check_shape(f"{part}.{param_name}", hf_tensor, (self.full_sizes[name], *param.shape[1:]))
                start = base + self.part_offsets[name]
                param[rows].copy_(hf_tensor[start:start + rows.stop - rows.start])
            if part is None:
                base += self.full_sizes[name]


class RowParallelLinear(nn.Module):
    """y = x W^T (+ b) where each rank holds a slice of W's input columns.

    With tp_size > 1 each rank's output is a partial sum: the all-reduce adds them, then the bias is added
    once; with tp_size == 1 this is a plain linear layer.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, device, dtype, tp=None):
        super().__init__()
        self.tp = tp
        self.tp_rank, self.tp_size = _rank_size(tp)
        local_in = _shard_size(in_features, self.tp_size, "input features")
        self.weight = _empty_param(out_features, local_in, device=device, dtype=dtype)
        self.bias = _empty_param(out_features, device=device, dtype=dtype) if bias else None
        self.gemv: GemvPlan | None = None  # set at load time by blink/model/fusion.py

    def forward(self, x: torch.Tensor, silu_mul_input: bool = False) -> torch.Tensor:
        """With silu_mul_input, x is a gate|up output: computes down(silu(gate) * up), fused when it can."""
        if self.tp_size == 1:
            return linear(x, self.weight, self.bias, silu_mul_input=silu_mul_input, gemv=self.gemv)
        out = self.tp.all_reduce(linear(x, self.weight, None, silu_mul_input=silu_mul_input, gemv=self.gemv))
        return out if self.bias is None else out + self.bias

    def load_hf(self, param_name: str, hf_tensor, part: str | None) -> None:
        param = getattr(self, param_name)
        if param_name == "bias":
            _check_shape("bias", hf_tensor, param.shape)
            param.copy_(read_all(hf_tensor))
            return
        local = param.shape[1]
        _check_shape("weight", hf_tensor, (param.shape[0], local * self.tp_size))
        param.copy_(hf_tensor[:, self.tp_rank * local:(self.tp_rank + 1) * local])
