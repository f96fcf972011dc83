"""The paged KV pool: per-layer K and V tensors of fixed-size blocks, and the host-side block allocator.

Layout: k[layer] and v[layer] are [num_blocks, block_size, num_kv_heads, head_dim] in the model dtype;
token t of a sequence lives in block block_ids[t // block_size] at offset t % block_size, i.e. at the flat
slot block * block_size + offset. Device mode keeps its own block lists on the GPU (csrc/sched_blocks.h)
over the same tensors.
"""
from __future__ import annotations

from collections import OrderedDict
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
    """Host mode's KV blocks: a LIFO stack of never-cached free blocks, a reference count per block (blocks
    of a cached prefix are shared) and, for prefix caching, an LRU of freed blocks whose contents are still
    cached. Allocation takes the stack first and evicts the LRU's oldest only when the stack is empty, so a
    cached block lives as long as possible. csrc/sched_blocks.h implements the same policy, step for step.

    gen[b] counts b's allocations: (block id, gen) names one life of a block, so a cached child that
    records its parent that way never matches a parent whose block was reused (blink/core/prefix_cache.py).
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self.ref = [0] * num_blocks
        self.gen = [0] * num_blocks
        self.cached = [False] * num_blocks  # set by the prefix cache for a full block it indexes
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks with ref 0, oldest first
        self.on_evict = lambda block: None  # the prefix cache drops the block from its index

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: never-cached free ones and cached ones nobody uses."""
        return len(self._free) + len(self.lru)

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self.lru.popitem(last=False)
                self.cached[b] = False
                self.on_evict(b)
            self.ref[b] = 1
            self.gen[b] += 1
            out.append(b)
        return out

    def share(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (a prefix hit); those nobody used leave the LRU."""
        for b in blocks:
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each block, last block first, so a sequence's tail is evicted first."""
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] > 0:
                continue
            if self.cached[b]:
                self.lru[b] = None
            else:
                self._free.append(b)
        blocks.clear()

    def uncache_all(self) -> None:
        """Forget every cached block (reset_prefix_cache): the LRU's, oldest first, go onto the stack."""
        for b in self.lru:
            self._free.append(b)
        self.lru.clear()
        self.cached = [False] * self.num_blocks
