// KV blocks, as host mode's BlockAllocator (blink/core/kv_cache.py) keeps them, decision for decision:
// a LIFO stack of never-cached free blocks, a holder count per block (a cached prefix is shared), an
// LRU of cached blocks nobody holds (evicted only when the stack is empty, oldest first), and the
// prefix cache's open-addressing hash table from a block's key to the block. Leader-only.
#pragma once

#include "sched_state.h"

namespace blink {

// -- hash table (linear probing; keys are unique: a key already present is never inserted twice) ------
BLINK_HD inline int table_find(const SchedState* s, uint64_t key) {
  for (int i = (int)(key & (uint64_t)s->hash_mask);; i = (i + 1) & s->hash_mask) {
    const int b = s->hash_table[i];
    if (b < 0) return -1;
    if (s->block_key[b] == key) return b;
  }
}

BLINK_HD inline void table_insert(SchedState* s, int b) {
  int i = (int)(s->block_key[b] & (uint64_t)s->hash_mask);
  while (s->hash_table[i] >= 0) i = (i + 1) & s->hash_mask;
  s->hash_table[i] = b;
}

// Backward-shift deletion: no tombstones, so probe runs stay as short as the load allows.
BLINK_HD inline void table_erase(SchedState* s, int b) {
  const int m = s->hash_mask;
  int i = (int)(s->block_key[b] & (uint64_t)m);
  while (s->hash_table[i] != b) i = (i + 1) & m;
  for (int j = (i + 1) & m; s->hash_table[j] >= 0; j = (j + 1) & m) {
    const int home = (int)(s->block_key[s->hash_table[j]] & (uint64_t)m);
    // The entry at j may move back to i unless its home lies cyclically in (i, j].
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    s->hash_table[i] = s->hash_table[j];
    i = j;
  }
  s->hash_table[i] = -1;
}

// -- the evictable LRU ---------------------------------------------------------------------------------
BLINK_HD inline void lru_push_back(SchedState* s, int b) {
  s->lru_prev[b] = s->lru_tail;
  s->lru_next[b] = -1;
  if (s->lru_tail >= 0) s->lru_next[s->lru_tail] = b;
  else s->lru_head = b;
  s->lru_tail = b;
  s->lru_count++;
}

BLINK_HD inline void lru_remove(SchedState* s, int b) {
  const int p = s->lru_prev[b], n = s->lru_next[b];
  if (p >= 0) s->lru_next[p] = n;
  else s->lru_head = n;
  if (n >= 0) s->lru_prev[n] = p;
  else s->lru_tail = p;
  s->lru_count--;
}

// -- the pool --------------------------------------------------------------------------------------------
BLINK_HD inline int free_block_count(const SchedState* s) { return s->free_block_top + s->lru_count; }

// A fresh block: the stack's top, else the LRU's oldest, evicted from the index. A new life: gen + 1.
BLINK_HD inline int take_block(SchedState* s) {
  int b;
  if (s->free_block_top > 0) {
    b = s->free_blocks[--s->free_block_top];
  } else {
    b = s->lru_head;
    lru_remove(s, b);
    s->block_cached[b] = 0;
    table_erase(s, b);
    s->evictions++;  // the team's prefix match (sched_prefix.h) may name an erased block now
  }
  s->block_ref[b] = 1;
  s->block_gen[b]++;
  return b;
}

// A holder lets go; the last one sends the block to the LRU if it is cached, else onto the stack.
BLINK_HD inline void drop_block(SchedState* s, int b) {
  if (--s->block_ref[b] > 0) return;
  if (s->block_cached[b]) lru_push_back(s, b);
  else s->free_blocks[s->free_block_top++] = b;
}

// A new holder of a cached block (a prefix hit); one nobody held leaves the LRU.
BLINK_HD inline void share_block(SchedState* s, int b) {
  if (s->block_ref[b]++ == 0) lru_remove(s, b);
}

}  // namespace blink
