"""The paged KV pool: per-layer K and V tensors of fixed-size blocks, and the host-side block allocator.

Layout: k[layer] and v[layer] are [num_blocks, block_size, num_kv_heads, head_dim] in the model dtype;
token t of a sequence lives in block block_ids[t // block_size] at offset t % block_size, i.e. at the flat
slot block * block_size + offset. Device mode keeps its own free list on the GPU over the same tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blink.core.limits import default_max_model_len

# Room left for activations, logits and graph pools when sizing the pool from --gpu-memory-utilization.
ACTIVATION_RESERVE_BYTES = 2 << 30


@dataclass
class KVCache:
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    block_size: int

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k, self.v, strict=True))


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def choose_num_blocks(args, cfg, dtype, device: str, per_block: int) -> int:
    """Explicit --num-kv-blocks wins; on a GPU size the pool from --gpu-memory-utilization; on CPU
    give every sequence room for its whole context (bounded to 4 GiB)."""
    if args.num_kv_blocks:
        return args.num_kv_blocks
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        budget = int(total * args.gpu_memory_utilization) - (total - free) - ACTIVATION_RESERVE_BYTES
        if budget < per_block:
            raise ValueError("not enough GPU memory left for the KV cache; raise --gpu-memory-utilization")
        return budget // per_block
    want = args.max_num_seqs * -(-cfg_max_len(args, cfg) // args.block_size)
    return max(1, min(want, (4 << 30) // per_block))


def cfg_max_len(args, cfg) -> int:
    return args.max_model_len or default_max_model_len(cfg.max_position_embeddings)


def allocate_kv_cache(cfg, num_blocks: int, block_size: int, dtype, device) -> KVCache:
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
    return KVCache(k, v, block_size)


class BlockAllocator:
    """A LIFO free list of block ids (host mode)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        out = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        return out

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        blocks.clear()
