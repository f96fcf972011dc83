"""Automatic prefix caching, host side: an index of full KV blocks by the chained hash of their tokens.

A block is indexed once all its tokens' K/V are computed (after the step that filled it). The chain
state is h_j = block_hash(h_{j-1}, tokens of block j) = (h_{j-1} ^ content_hash(block j)) * odd, h_{-1} = 0,
with content_hash a 64-bit FNV-1a over the block's token ids alone: so the GPU hashes every block's
contents in parallel (one block per thread) and only the chain, one xor-multiply per block, is
sequential. The index key is block_key(h_j), the splitmix64 finalizer (a bijection: open addressing in
the GPU's table needs spread low bits). Admission walks a sequence's full blocks from the first, looking
each key up, and stops at the first miss.

Collisions never give wrong output: the hash only finds a candidate. A candidate matches only if its
stored token ids equal the block's and its stored parent is the block matched one step before, named by
(block id, allocation count) so a parent whose block was evicted and reused never matches. By induction a
match is the exact token prefix, whatever the hash. A key already indexed is never indexed twice: the
second block stays private (a true collision costs a miss, nothing more).

csrc/sched_prefix.h is the same logic on the GPU; tests/device checks both make the same decisions.
"""
from __future__ import annotations

from dataclasses import dataclass

from blink.core.kv_cache import BlockAllocator

MASK64 = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
CHAIN_MUL = 0x9E3779B97F4A7C15  # odd: the chain step is a bijection of the parent's state
NO_PARENT = (-1, 0)  # the first block's parent


def content_hash(tokens) -> int:
    """64-bit FNV-1a over one block's token ids (their low 32 bits), independent of its parent."""
    h = FNV_OFFSET
    for t in tokens:
        h = ((h ^ (t & 0xFFFFFFFF)) * FNV_PRIME) & MASK64
    return h


def block_hash(parent: int, tokens) -> int:
    """The chain state after this block: the parent's state mixed with the block's content hash."""
    return ((parent ^ content_hash(tokens)) * CHAIN_MUL) & MASK64


def block_key(state: int) -> int:
    """The index key of a chain state: splitmix64's finalizer (a bijection, so keys collide iff states do)."""
    h = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK64
    return h ^ (h >> 31)


@dataclass
class PrefixHit:
    blocks: list[int]  # cached blocks holding the prefix, in order
    chain_hash: int  # chain state after the last of them (0: none)
    chain_parent: tuple[int, int]  # (block, gen) the next block of this sequence records as its parent
    num_in_lru: int  # of `blocks`, how many nobody uses now (taking them shrinks the free count)


class PrefixCache:
    def __init__(self, blocks: BlockAllocator, block_size: int):
        self.blocks = blocks
        self.block_size = block_size
        self.index: dict[int, int] = {}  # key -> block
        self.key = [0] * blocks.num_blocks
        self.tokens: list[tuple[int, ...]] = [()] * blocks.num_blocks
        self.parent = [NO_PARENT] * blocks.num_blocks
        blocks.on_evict = self._evict
        self.queries = 0  # prompt tokens looked up at admission (Prometheus: prefix-cache queries)
        self.hits = 0  # of those, found cached

    def _evict(self, b: int) -> None:
        del self.index[self.key[b]]

    def _equal(self, b: int, tokens: tuple[int, ...], parent: tuple[int, int]) -> bool:
        return self.tokens[b] == tokens and self.parent[b] == parent

    def match(self, seq) -> PrefixHit:
        """The longest cached prefix of `seq`'s full blocks, leaving its last token to compute (so its
        logits exist). Changes nothing."""
        bs, out = self.block_size, []
        h, parent, in_lru = 0, NO_PARENT, 0
        for j in range((seq.num_tokens - 1) // bs):
            toks = seq.tokens(j * bs, (j + 1) * bs)
            state = block_hash(h, toks)
            b = self.index.get(block_key(state))
            if b is None or not self._equal(b, toks, parent):
                break
            out.append(b)
            in_lru += self.blocks.ref[b] == 0
            h, parent = state, (b, self.blocks.gen[b])
        return PrefixHit(out, h, parent, in_lru)

    def admit(self, seq, hit: PrefixHit) -> None:
        """Share the hit's blocks with `seq` (which holds none yet) and count the lookup."""
        self.blocks.share(hit.blocks)
        seq.block_ids = list(hit.blocks)
        seq.num_computed = seq.num_hashed = len(hit.blocks)
        seq.num_computed *= self.block_size
        seq.chain_hash, seq.chain_parent = hit.chain_hash, hit.chain_parent
        self.queries += seq.num_tokens
        self.hits += seq.num_computed
        if seq.num_cached_tokens < 0:  # usage reports the first admission's hit, as vLLM
            seq.num_cached_tokens = seq.num_computed

    def register(self, seq) -> None:
        """Index the blocks `seq` has filled since the last call (their K/V are computed now)."""
        bs = self.block_size
        for j in range(seq.num_hashed, seq.num_computed // bs):
            b, toks = seq.block_ids[j], seq.tokens(j * bs, (j + 1) * bs)
            state = block_hash(seq.chain_hash, toks)
            key = block_key(state)
            other = self.index.get(key)
            if other is None:
                self.index[key] = b
                self.key[b], self.tokens[b], self.parent[b] = key, toks, seq.chain_parent
                self.blocks.cached[b] = True
                seq.chain_parent = (b, self.blocks.gen[b])
            elif self._equal(other, toks, seq.chain_parent):
                seq.chain_parent = (other, self.blocks.gen[other])  # the same content: children may hang there
            else:
                seq.chain_parent = (b, self.blocks.gen[b])  # a true collision: b stays private
            seq.chain_hash = state
        seq.num_hashed = max(seq.num_hashed, seq.num_computed // bs)

    def reset(self) -> None:
        """Forget every cached block (POST /reset_prefix_cache). Blocks in use stay with their sequences."""
        self.index.clear()
        self.blocks.uncache_all()
