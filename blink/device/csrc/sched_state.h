// The scheduler state's layout: its arrays carved out of one buffer, and a fresh state.
#pragma once

#include "sched_types.h"

namespace blink {

BLINK_HD inline int64_t token_stride(const SchedConfig& c) { return (int64_t)c.max_model_len + 1; }

// The prefix cache's hash table: a power of two, at least twice the blocks (short probe runs).
BLINK_HD inline uint64_t hash_capacity(const SchedConfig& c) {
  uint64_t n = 2;
  while (n < 2 * (uint64_t)c.num_blocks) n *= 2;
  return n;
}

// Carve the arrays out of the buffer that starts with the SchedState; returns the bytes needed.
// With state == nullptr it only measures.
BLINK_HD inline uint64_t sched_carve(SchedState* s, const SchedConfig& c) {
  uint64_t off = (sizeof(SchedState) + 255) & ~uint64_t(255);
  char* base = reinterpret_cast<char*>(s);
  auto take = [&](uint64_t bytes) -> void* {
    void* p = base ? base + off : nullptr;
    off += (bytes + 255) & ~uint64_t(255);
    return p;
  };
  const uint64_t R = c.max_requests, S = c.max_num_seqs, i4 = 4;
  const uint64_t NB = c.num_blocks;
  void* p[39];
  p[0] = take(R * sizeof(RequestEntry));
  p[1] = take(R * i4);
  p[2] = take(R * i4);
  p[3] = take(S * i4);
  p[4] = take((uint64_t)c.num_blocks * i4);
  p[5] = take(S * i4);
  p[6] = take(S * c.max_blocks_per_seq * i4);
  p[7] = take(R * token_stride(c) * i4);
  p[8] = take(R * kMaxLogitBias * i4);
  p[9] = take(R * kMaxLogitBias * i4);
  for (int k = 10; k < 15; ++k) p[k] = take(S * i4);
  p[15] = take(kIngestBatch * sizeof(RequestDescriptor));
  p[16] = take(kIngestBatch * i4);
  p[17] = take(kIngestBatch * i4);
  p[18] = take(S * i4);
  for (int k = 19; k < 22; ++k) p[k] = take(S * i4);
  for (int k = 22; k < 27; ++k) p[k] = take(NB * i4);
  p[27] = take(NB * 8);
  p[28] = take(NB * i4);
  p[29] = take(NB * i4);
  p[30] = take(NB * c.block_size * i4);
  p[31] = take(hash_capacity(c) * i4);
  p[32] = take((uint64_t)c.max_blocks_per_seq * i4);
  p[33] = take(S * i4);
  p[34] = take((uint64_t)kMatchAhead * c.max_blocks_per_seq * 8);  // issue 16: the team's prefix match
  p[35] = take((uint64_t)kMatchAhead * c.max_blocks_per_seq * i4);
  p[36] = take(S * i4);
  p[37] = take(S * sizeof(PendingRecord));
  p[38] = take(S * sizeof(AheadRow));
  if (s) {
    s->entries = (RequestEntry*)p[0];
    s->free_entries = (int32_t*)p[1];
    s->waiting = (int32_t*)p[2];
    s->running = (int32_t*)p[3];
    s->free_blocks = (int32_t*)p[4];
    s->free_slots = (int32_t*)p[5];
    s->block_tables = (int32_t*)p[6];
    s->token_store = (int32_t*)p[7];
    s->bias_ids = (int32_t*)p[8];
    s->bias_vals = (float*)p[9];
    s->row_entry = (int32_t*)p[10];
    s->row_start = (int32_t*)p[11];
    s->row_len = (int32_t*)p[12];
    s->row_qstart = (int32_t*)p[13];
    s->job_entry = (int32_t*)p[14];
    s->staged = (RequestDescriptor*)p[15];
    s->staged_entry = (int32_t*)p[16];
    s->staged_bad = (int32_t*)p[17];
    s->order = (int32_t*)p[18];
    s->row_need = (int32_t*)p[19];
    s->row_record = (int32_t*)p[20];
    s->row_reason = (int32_t*)p[21];
    s->block_ref = (int32_t*)p[22];
    s->block_gen = (uint32_t*)p[23];
    s->block_cached = (int32_t*)p[24];
    s->lru_prev = (int32_t*)p[25];
    s->lru_next = (int32_t*)p[26];
    s->block_key = (uint64_t*)p[27];
    s->block_parent = (int32_t*)p[28];
    s->block_parent_gen = (uint32_t*)p[29];
    s->block_tokens = (int32_t*)p[30];
    s->hash_table = (int32_t*)p[31];
    s->match_blocks = (int32_t*)p[32];
    s->row_register = (int32_t*)p[33];
    s->ahead_state = (uint64_t*)p[34];
    s->ahead_blocks = (int32_t*)p[35];
    s->filled_rows = (int32_t*)p[36];
    s->pending = (PendingRecord*)p[37];
    s->ahead_check = (AheadRow*)p[38];
  }
  return off;
}

// Fresh state: every block, slot and entry free, empty queues. Stacks pop the lowest id first.
BLINK_HD inline void sched_init(SchedState* s, const SchedConfig& c, uint64_t ingress_head,
                                uint64_t arena_head, uint64_t egress_tail) {
  char* raw = reinterpret_cast<char*>(s);
  for (uint64_t i = 0; i < sizeof(SchedState); ++i) raw[i] = 0;
  sched_carve(s, c);
  s->ingress_head = ingress_head;
  s->arena_head = arena_head;
  s->egress_tail = egress_tail;
  for (int i = 0; i < c.num_blocks; ++i) s->free_blocks[i] = c.num_blocks - 1 - i;
  s->free_block_top = c.num_blocks;
  for (int b = 0; b < c.num_blocks; ++b) {
    s->block_ref[b] = s->block_cached[b] = 0;
    s->block_gen[b] = 0;
  }
  s->lru_head = s->lru_tail = -1;
  s->hash_mask = (int32_t)hash_capacity(c) - 1;
  for (int i = 0; i <= s->hash_mask; ++i) s->hash_table[i] = -1;
  for (int i = 0; i < c.max_num_seqs; ++i) s->free_slots[i] = c.max_num_seqs - 1 - i;
  s->free_slot_top = c.max_num_seqs;
  for (int i = 0; i < c.max_requests; ++i) {
    s->free_entries[i] = c.max_requests - 1 - i;
    s->entries[i].status = kFree;
    s->entries[i].slot = -1;
    s->entries[i].planned_row = -1;
  }
  s->free_entry_top = c.max_requests;
}

}  // namespace blink
