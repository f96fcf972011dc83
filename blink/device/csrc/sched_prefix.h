// Prefix caching on the GPU: blink/core/prefix_cache.py, rule for rule (its docstring has the why).
// A full block's key is block_key(chain state), the state = block_hash(parent's state, its tokens);
// admission walks a request's full blocks and shares each that is indexed under its key AND holds the
// same tokens AND records the block matched just before as its parent, by (block, gen): a match is the
// exact token prefix, whatever the hash. The team does the O(tokens) work (content hashes, token
// compares) one block per thread; one thread per request mixes the chain (one word per block); the
// leader admits at O(1) per request when the hit's blocks are all held, else O(blocks), never O(tokens)
// for the first kMatchAhead of a plan. After a step, a row's newly filled block is keyed by its thread
// (several: by the team) and indexed by the leader in row order. Reset is a command word in the control
// block, applied between steps.
#pragma once

#include "sched_egress.h"
#include "sched_prefix_hash.h"

namespace blink {

BLINK_HD inline bool block_tokens_equal(const SchedState* s, const SchedConfig& c, int b, const int32_t* tokens) {
  const int32_t* own = s->block_tokens + (int64_t)b * c.block_size;
  for (int i = 0; i < c.block_size; ++i)
    if (own[i] != tokens[i]) return false;
  return true;
}

BLINK_HD inline bool block_equal(const SchedState* s, const SchedConfig& c, int b, const int32_t* tokens,
                                 int32_t parent, uint32_t parent_gen) {
  return s->block_parent[b] == parent && s->block_parent_gen[b] == parent_gen && block_tokens_equal(s, c, b, tokens);
}

struct PrefixMatch {
  int num_blocks;  // in `blocks`
  int num_in_lru;  // of those, held by nobody now
  uint64_t chain_hash;
  int32_t parent;
  uint32_t parent_gen;
  const int32_t* blocks;
  int ahead;  // the team's match k (its blocks stay put until the next step), or -1: s->match_blocks
};

BLINK_HD inline int match_limit(const SchedState* s, const SchedConfig& c, int e) {
  return (entry_num_tokens(s->entries[e]) - 1) / c.block_size;  // the last token is always computed
}

// Leader, one block at a time: the longest cached prefix of entry e's full blocks, into s->match_blocks.
// For requests past the first kMatchAhead of a plan, which the team's match (below) did not cover.
BLINK_HD inline PrefixMatch prefix_match(SchedState* s, const SchedConfig& c, int e) {
  PrefixMatch m{0, 0, 0, -1, 0, s->match_blocks, -1};
  if (!c.enable_prefix_caching) return m;
  const int32_t* tokens = entry_tokens(s, c, e);
  const int limit = match_limit(s, c, e);
  for (int j = 0; j < limit; ++j) {
    const int32_t* block = tokens + (int64_t)j * c.block_size;
    const uint64_t state = block_hash(m.chain_hash, block, c.block_size);
    const int b = table_find(s, block_key(state));
    if (b < 0 || !block_equal(s, c, b, block, m.parent, m.parent_gen)) break;
    s->match_blocks[m.num_blocks++] = b;
    m.num_in_lru += s->block_ref[b] == 0;
    m.chain_hash = state;
    m.parent = b;
    m.parent_gen = s->block_gen[b];
  }
  return m;
}

// Team, before the leader admits: the hits of the first waiting requests (at most kMatchAhead, only
// those that could be admitted), computed flat over (request, block): content hashes, then each
// request's chain (one thread per request, one mix per block), then lookups and token compares, then
// parent links and the hit length (the first block that breaks the chain), then the hit's LRU count.
// The leader set s->plan_budget; everything here reads state the leader does not change until it admits
// (prefix_match_admit then corrects for what its admissions change: evictions, LRU counts).
BLINK_HD inline void prefix_match_ahead(const Team& t, SchedState* s, const SchedConfig& c) {
  if (!c.enable_prefix_caching) return;
  if (t.leader()) {
    // Each admission takes a seat, a token of budget and a fresh block at least (its last token is never
    // cached): no more can be admitted than the least of those, so under memory pressure the team
    // matches only the few that might fit.
    int n = s->waiting_count < kMatchAhead ? s->waiting_count : kMatchAhead;
    const int bounds[3] = {c.max_num_seqs - s->running_count, s->plan_budget, free_block_count(s)};
    for (int b : bounds) n = b < n ? b : n;
    if (n < 0) n = 0;
    s->ahead_count = n;
    s->ahead_evictions = s->evictions;
  }
  t.sync();
  const int n = load_volatile(&s->ahead_count), mb = c.max_blocks_per_seq, bs = c.block_size;
  if (n == 0) return;
  for (int i = 0; i < n; ++i) {
    const int e = s->waiting[(s->waiting_head + i) % c.max_requests], limit = match_limit(s, c, e);
    const int32_t* tokens = entry_tokens(s, c, e);
    for (int j = t.rank; j < limit; j += t.size)
      s->ahead_state[i * mb + j] = content_hash(tokens + (int64_t)j * bs, bs);
  }
  t.sync();
  for (int i = t.rank; i < n; i += t.size) {
    const int limit = match_limit(s, c, s->waiting[(s->waiting_head + i) % c.max_requests]);
    uint64_t h = 0;
    for (int j = 0; j < limit; ++j) s->ahead_state[i * mb + j] = h = chain_state(h, s->ahead_state[i * mb + j]);
    s->ahead_len[i] = limit;
    s->ahead_in_lru[i] = 0;
  }
  t.sync();
  for (int i = 0; i < n; ++i) {
    const int e = s->waiting[(s->waiting_head + i) % c.max_requests], limit = match_limit(s, c, e);
    const int32_t* tokens = entry_tokens(s, c, e);
    for (int j = t.rank; j < limit; j += t.size) {
      const int b = table_find(s, block_key(s->ahead_state[i * mb + j]));
      s->ahead_blocks[i * mb + j] = b >= 0 && block_tokens_equal(s, c, b, tokens + (int64_t)j * bs) ? b : -1;
    }
  }
  t.sync();
  for (int i = 0; i < n; ++i) {
    const int limit = load_volatile(&s->ahead_len[i]);
    const int32_t* found = s->ahead_blocks + i * mb;
    for (int j = t.rank; j < limit; j += t.size) {
      const int b = found[j], parent = j > 0 ? found[j - 1] : -1;
      const bool linked = b >= 0 && (j == 0 || parent >= 0) && s->block_parent[b] == parent &&
                          s->block_parent_gen[b] == (parent >= 0 ? s->block_gen[parent] : 0u);
      if (!linked) prefix_atomic_min(&s->ahead_len[i], j);
    }
  }
  t.sync();
  for (int i = 0; i < n; ++i) {
    const int len = load_volatile(&s->ahead_len[i]);
    for (int j = t.rank; j < len; j += t.size)
      if (s->block_ref[s->ahead_blocks[i * mb + j]] == 0) atomic_add(&s->ahead_in_lru[i], 1);
  }
  t.sync();
}

// Leader: the hit of the k-th request admitted in this step (the waiting queue's front now). The team's
// is exact unless this plan changed the pool since: an eviction erased the hit's block j (the hit then ends
// before j, as a fresh walk would stop there; evicted blocks are the only ones no longer cached), or an
// earlier admission took some of its LRU blocks. Then one pass over the hit's blocks, no tokens, fixes both.
BLINK_HD inline PrefixMatch prefix_match_admit(SchedState* s, const SchedConfig& c, int e, int k) {
  if (!c.enable_prefix_caching || k >= s->ahead_count) return prefix_match(s, c, e);
  const int mb = c.max_blocks_per_seq;
  PrefixMatch m{s->ahead_len[k], s->ahead_in_lru[k], 0, -1, 0, s->ahead_blocks + k * mb, k};
  const bool evicted = s->evictions != s->ahead_evictions;
  if (evicted || (k > 0 && m.num_in_lru > 0)) {
    int len = 0, in_lru = 0;
    for (; len < m.num_blocks && (!evicted || s->block_cached[m.blocks[len]]); ++len)
      in_lru += s->block_ref[m.blocks[len]] == 0;
    m.num_blocks = len;
    m.num_in_lru = in_lru;
  }
  if (m.num_blocks > 0) {
    m.chain_hash = s->ahead_state[k * mb + m.num_blocks - 1];
    m.parent = m.blocks[m.num_blocks - 1];
    m.parent_gen = s->block_gen[m.parent];
  }
  s->team_matches++;
  return m;
}

// Leader: entry e (admitted, holding no block yet) shares the match's blocks and skips their tokens.
// A team match none of whose blocks is in the LRU (the steady state: running requests hold the shared
// prefix) changes no list, only holder counts that stay > 0: the team applies it after the plan.
BLINK_HD inline void prefix_admit(SchedState* s, const SchedConfig& c, int e, const PrefixMatch& m) {
  RequestEntry& r = s->entries[e];
  int32_t* table = slot_blocks(s, c, r.slot);
  if (m.ahead >= 0 && m.num_in_lru == 0 && m.num_blocks > 0) {
    const int i = s->num_shares++;
    s->team_shares++;
    s->share_entry[i] = e;
    s->share_ahead[i] = m.ahead;
    s->share_len[i] = m.num_blocks;
  } else {
    for (int j = 0; j < m.num_blocks; ++j) {
      share_block(s, m.blocks[j]);
      table[j] = m.blocks[j];
    }
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

// Team, after schedule() and a sync: the shares prefix_admit left to it (holder counts + 1, block tables).
// Before anything reads either: fail_step's frees, the inputs, the next step.
BLINK_HD inline void prefix_apply_shares(const Team& t, SchedState* s, const SchedConfig& c) {
  const int n = load_volatile(&s->num_shares), mb = c.max_blocks_per_seq;
  if (n == 0) return;
  for (int i = 0; i < n; ++i) {
    const int32_t* blocks = s->ahead_blocks + s->share_ahead[i] * mb;
    int32_t* table = slot_blocks(s, c, s->entries[s->share_entry[i]].slot);
    for (int j = t.rank; j < s->share_len[i]; j += t.size) {
      atomic_add(&s->block_ref[blocks[j]], 1);
      table[j] = blocks[j];
    }
  }
  t.sync();
  if (t.leader()) s->num_shares = 0;
}

// Row thread, after the row's num_computed advanced: did it fill blocks that are not indexed yet? Counted
// (none: the leader skips its scan); a single block (a decode's, a short chunk's) is keyed and copied right
// here, into the block's own slots (it is the row's alone until the leader indexes it); rows that filled
// more are listed (any order) for the team.
BLINK_HD inline int prefix_note_row(SchedState* s, const SchedConfig& c, int e, int row) {
  if (!c.enable_prefix_caching) return 0;
  RequestEntry& r = s->entries[e];
  const int bs = c.block_size, j = r.num_hashed;
  if (r.num_computed / bs <= j) return 0;
  atomic_add(&s->num_register, 1);
  if (r.num_computed / bs > j + 1) {
    s->filled_rows[prefix_fetch_add(&s->num_filled, 1)] = row;
    return 1;
  }
  const int b = slot_blocks(s, c, r.slot)[j];
  const int32_t* block = entry_tokens(s, c, e) + (int64_t)j * bs;
  for (int i = 0; i < bs; ++i) s->block_tokens[(int64_t)b * bs + i] = block[i];
  r.chain_hash = block_hash(r.chain_hash, block, bs);
  s->block_key[b] = block_key(r.chain_hash);
  return 1;
}

// Team, after finish_rows and a sync: the listed rows' filled blocks, into the blocks' own slots: content
// hashes and token copies flat over (row, block), then each row's chain on one thread (one mix per
// block), which also advances the entry's chain state. No listed row (decode steps): no barrier.
BLINK_HD inline void prefix_hash_filled(const Team& t, SchedState* s, const SchedConfig& c) {
  const int n = c.enable_prefix_caching ? load_volatile(&s->num_filled) : 0, bs = c.block_size;
  if (n == 0) return;
  for (int i = 0; i < n; ++i) {
    const int e = s->row_entry[s->filled_rows[i]];
    const RequestEntry& r = s->entries[e];
    const int32_t* tokens = entry_tokens(s, c, e);
    const int32_t* table = slot_blocks(s, c, r.slot);
    const int first = r.num_hashed, count = r.num_computed / bs - first;
    for (int k = t.rank; k < count * bs; k += t.size) {  // token copies, one token per thread
      const int j = first + k / bs;
      s->block_tokens[(int64_t)table[j] * bs + k % bs] = tokens[(int64_t)j * bs + k % bs];
    }
    for (int j = first + t.rank; j < first + count; j += t.size)
      s->block_key[table[j]] = content_hash(tokens + (int64_t)j * bs, bs);
  }
  t.sync();
  for (int i = t.rank; i < n; i += t.size) {
    RequestEntry& r = s->entries[s->row_entry[s->filled_rows[i]]];
    const int32_t* table = slot_blocks(s, c, r.slot);
    uint64_t h = r.chain_hash;
    for (int j = r.num_hashed; j < r.num_computed / bs; ++j) {
      h = chain_state(h, s->block_key[table[j]]);
      s->block_key[table[j]] = block_key(h);
    }
    r.chain_hash = h;
  }
  t.sync();
}

// Leader, rows in order: index the blocks prefix_hash_filled keyed (PrefixCache.register).
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
