// Prefix caching on the GPU: blink/core/prefix_cache.py, rule for rule (its docstring has the why).
// A full block's key is block_hash(parent's key, its tokens); admission walks a request's full blocks
// and shares each that is indexed under its key AND holds the same tokens AND records the block matched
// just before as its parent, by (block, gen): a match is the exact token prefix, whatever the hash.
// After a step, each row's newly filled blocks are hashed by the row's thread and indexed by the leader
// in row order. Reset is a command word in the control block, applied between steps.
#pragma once

#include "sched_egress.h"

namespace blink {

// 64-bit FNV-1a over the token ids, seeded with the parent's key, then splitmix64's finalizer.
BLINK_HD inline uint64_t block_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = parent ^ 0xCBF29CE484222325ull;
  for (int i = 0; i < n; ++i) h = (h ^ (uint32_t)tokens[i]) * 0x100000001B3ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

BLINK_HD inline bool block_equal(const SchedState* s, const SchedConfig& c, int b, const int32_t* tokens,
                                 int32_t parent, uint32_t parent_gen) {
  if (s->block_parent[b] != parent || s->block_parent_gen[b] != parent_gen) return false;
  const int32_t* own = s->block_tokens + (int64_t)b * c.block_size;
  for (int i = 0; i < c.block_size; ++i)
    if (own[i] != tokens[i]) return false;
  return true;
}

struct PrefixMatch {
  int num_blocks;  // in s->match_blocks
  int num_in_lru;  // of those, held by nobody now
  uint64_t chain_hash;
  int32_t parent;
  uint32_t parent_gen;
};

// Leader: the longest cached prefix of entry e's full blocks, leaving its last token to compute.
BLINK_HD inline PrefixMatch prefix_match(SchedState* s, const SchedConfig& c, int e) {
  PrefixMatch m{0, 0, 0, -1, 0};
  if (!c.enable_prefix_caching) return m;
  const int32_t* tokens = entry_tokens(s, c, e);
  const int limit = (entry_num_tokens(s->entries[e]) - 1) / c.block_size;
  for (int j = 0; j < limit; ++j) {
    const int32_t* block = tokens + (int64_t)j * c.block_size;
    const uint64_t key = block_hash(m.chain_hash, block, c.block_size);
    const int b = table_find(s, key);
    if (b < 0 || !block_equal(s, c, b, block, m.parent, m.parent_gen)) break;
    s->match_blocks[m.num_blocks++] = b;
    m.num_in_lru += s->block_ref[b] == 0;
    m.chain_hash = key;
    m.parent = b;
    m.parent_gen = s->block_gen[b];
  }
  return m;
}

// Leader: entry e (admitted, holding no block yet) shares the match's blocks and skips their tokens.
BLINK_HD inline void prefix_admit(SchedState* s, const SchedConfig& c, int e, const PrefixMatch& m) {
  RequestEntry& r = s->entries[e];
  int32_t* table = slot_blocks(s, c, r.slot);
  for (int j = 0; j < m.num_blocks; ++j) {
    share_block(s, s->match_blocks[j]);
    table[j] = s->match_blocks[j];
  }
  r.num_blocks = r.num_hashed = m.num_blocks;
  r.num_computed = m.num_blocks * c.block_size;
  r.chain_hash = m.chain_hash;
  r.chain_parent = m.parent;
  r.chain_parent_gen = m.parent_gen;
  if (c.enable_prefix_caching) {
    s->prefix_queries += (uint64_t)entry_num_tokens(r);
    s->prefix_hits += (uint64_t)r.num_computed;
  }
  if (r.num_cached_tokens < 0) r.num_cached_tokens = r.num_computed;  // usage: the first admission's
}

// Row thread, after the row's num_computed advanced: key and tokens of each block it filled, into the
// block's own slots (the block is the row's alone until the leader indexes it). Returns whether there
// was any (the leader then indexes them: it scans one flag per row, not every row's entry).
BLINK_HD inline int prefix_hash_row(SchedState* s, const SchedConfig& c, int e) {
  if (!c.enable_prefix_caching) return 0;
  const RequestEntry& r = s->entries[e];
  if (r.num_computed / c.block_size <= r.num_hashed) return 0;
  const int32_t* tokens = entry_tokens(s, c, e);
  const int32_t* table = slot_blocks(s, c, r.slot);
  uint64_t key = r.chain_hash;
  for (int j = r.num_hashed; j < r.num_computed / c.block_size; ++j) {
    const int b = table[j];
    const int32_t* block = tokens + (int64_t)j * c.block_size;
    key = block_hash(key, block, c.block_size);
    s->block_key[b] = key;
    for (int i = 0; i < c.block_size; ++i) s->block_tokens[(int64_t)b * c.block_size + i] = block[i];
  }
  return 1;
}

// Leader, rows in order: index the blocks prefix_hash_row keyed (PrefixCache.register).
BLINK_HD inline void prefix_register(SchedState* s, const SchedConfig& c, int e) {
  if (!c.enable_prefix_caching) return;
  RequestEntry& r = s->entries[e];
  const int32_t* table = slot_blocks(s, c, r.slot);
  const int full = r.num_computed / c.block_size;
  for (int j = r.num_hashed; j < full; ++j) {
    const int b = table[j];
    const int other = table_find(s, s->block_key[b]);
    int32_t parent = b;
    if (other < 0) {
      s->block_parent[b] = r.chain_parent;
      s->block_parent_gen[b] = r.chain_parent_gen;
      s->block_cached[b] = 1;
      table_insert(s, b);
    } else if (block_equal(s, c, other, s->block_tokens + (int64_t)b * c.block_size, r.chain_parent,
                           r.chain_parent_gen)) {
      parent = other;  // the same content: children may hang there
    }  // else a true collision: b stays private
    r.chain_parent = parent;
    r.chain_parent_gen = s->block_gen[parent];
    r.chain_hash = s->block_key[b];
  }
  if (full > r.num_hashed) r.num_hashed = full;
}

// Team: forget every cached block (POST /reset_prefix_cache); blocks in use stay with their requests.
// The LRU's blocks go onto the stack oldest first, as BlockAllocator.uncache_all.
BLINK_HD inline void prefix_reset(const Team& t, SchedState* s, const SchedConfig& c) {
  if (t.leader()) {
    for (int b = s->lru_head; b >= 0; b = s->lru_next[b]) s->free_blocks[s->free_block_top++] = b;
    s->lru_head = s->lru_tail = -1;
    s->lru_count = 0;
  }
  t.sync();
  for (int b = t.rank; b < c.num_blocks; b += t.size) s->block_cached[b] = 0;
  for (int i = t.rank; i <= s->hash_mask; i += t.size) s->hash_table[i] = -1;
  t.sync();
}

}  // namespace blink
