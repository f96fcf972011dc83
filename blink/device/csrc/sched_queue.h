// Request table, FCFS waiting queue, running list, KV block and slot free lists: the bookkeeping
// behind admission and preemption. Leader-only (one thread), host and device alike.
#pragma once

#include "sched_blocks.h"

namespace blink {

BLINK_HD inline int32_t* entry_tokens(SchedState* s, const SchedConfig& c, int e) {
  return s->token_store + (int64_t)e * token_stride(c);
}
BLINK_HD inline int32_t* slot_blocks(SchedState* s, const SchedConfig& c, int slot) {
  return s->block_tables + (int64_t)slot * c.max_blocks_per_seq;
}
BLINK_HD inline int entry_num_tokens(const RequestEntry& r) { return (int)r.desc.prompt_len + r.num_generated; }
BLINK_HD inline int entry_remaining(const RequestEntry& r) { return entry_num_tokens(r) - r.num_computed; }
// Whether planned row k reaches its sequence's end, so a token is sampled after it (ScheduledChunk.samples); a
// row mid-prefill samples the scratch slot instead.
BLINK_HD inline bool row_samples(const SchedState* s, int k) {
  return s->row_start[k] + s->row_len[k] == entry_num_tokens(s->entries[s->row_entry[k]]);
}
// Prompt logprobs (blink/core/sequence.py): the top-N a request asks for (-1: none, flags bits 8-15 hold N + 1),
// and the rows a chunk [start, start + n) needs until the first token is out (Sequence.prompt_rows).
BLINK_HD inline int prompt_top_for(const RequestDescriptor& d) { return (int)((d.flags & kPromptLogprobsMask) >> 8) - 1; }
BLINK_HD inline int entry_prompt_rows(const RequestEntry& r, int start, int n) {
  if (prompt_top_for(r.desc) < 0 || r.num_generated > 0) return 0;
  const int k = (int)r.desc.prompt_len - 1 - start;
  return k < 0 ? 0 : k < n ? k : n;
}
// n cut so the chunk's prompt rows fit in what the step being planned has left (0: it waits).
BLINK_HD inline int prompt_cap(const SchedState* s, const SchedConfig& c, const RequestEntry& r, int start, int n) {
  const int left = c.prompt_logprob_rows - s->plan_prompt_rows;
  return entry_prompt_rows(r, start, n) <= left ? n : left;
}
BLINK_HD inline bool entry_is_decode(const RequestEntry& r) {
  return entry_remaining(r) == 1 && r.num_generated > 0;
}

// -- waiting queue (circular, capacity max_requests) ------------------------------------------------
BLINK_HD inline void waiting_push_back(SchedState* s, const SchedConfig& c, int e) {
  s->waiting[(s->waiting_head + s->waiting_count) % c.max_requests] = e;
  s->waiting_count++;
}
BLINK_HD inline void waiting_push_front(SchedState* s, const SchedConfig& c, int e) {
  s->waiting_head = (s->waiting_head + c.max_requests - 1) % c.max_requests;
  s->waiting[s->waiting_head] = e;
  s->waiting_count++;
}
BLINK_HD inline int waiting_front(const SchedState* s) { return s->waiting[s->waiting_head]; }
BLINK_HD inline void waiting_pop_front(SchedState* s, const SchedConfig& c) {
  s->waiting_head = (s->waiting_head + 1) % c.max_requests;
  s->waiting_count--;
}
BLINK_HD inline void waiting_remove(SchedState* s, const SchedConfig& c, int e) {
  int n = s->waiting_count, k = 0;
  while (k < n && s->waiting[(s->waiting_head + k) % c.max_requests] != e) ++k;
  if (k == n) return;
  for (; k + 1 < n; ++k)
    s->waiting[(s->waiting_head + k) % c.max_requests] = s->waiting[(s->waiting_head + k + 1) % c.max_requests];
  s->waiting_count--;
}

// -- running list (admission order) -------------------------------------------------------------------
BLINK_HD inline void running_remove(SchedState* s, int e) {
  int k = 0;
  while (k < s->running_count && s->running[k] != e) ++k;
  for (; k + 1 < s->running_count; ++k) s->running[k] = s->running[k + 1];
  if (s->running_count > 0) s->running_count--;
}

// -- KV blocks (sched_blocks.h: the same order as the host engine's BlockAllocator) -----------------
BLINK_HD inline int blocks_needed(const SchedConfig& c, const RequestEntry& r, int upto) {
  int need = (upto + c.block_size - 1) / c.block_size - r.num_blocks;
  return need > 0 ? need : 0;
}

// All-or-nothing: the request's blocks cover `upto` tokens afterwards, or nothing changed.
BLINK_HD inline bool grow_blocks(SchedState* s, const SchedConfig& c, int e, int upto) {
  RequestEntry& r = s->entries[e];
  int need = blocks_needed(c, r, upto);
  if (need > free_block_count(s)) return false;
  int32_t* table = slot_blocks(s, c, r.slot);
  for (int i = 0; i < need; ++i) table[r.num_blocks++] = take_block(s);
  return true;
}

BLINK_HD inline void release_blocks_and_slot(SchedState* s, const SchedConfig& c, int e) {
  RequestEntry& r = s->entries[e];
  if (r.slot < 0) return;
  int32_t* table = slot_blocks(s, c, r.slot);
  for (int i = r.num_blocks - 1; i >= 0; --i) drop_block(s, table[i]);  // the tail first: evicted first
  r.num_blocks = 0;
  s->free_slots[s->free_slot_top++] = r.slot;
  r.slot = -1;
}

// -- request lifetime --------------------------------------------------------------------------------
BLINK_HD inline int take_entry(SchedState* s) {
  return s->free_entry_top > 0 ? s->free_entries[--s->free_entry_top] : -1;
}

BLINK_HD inline void free_entry(SchedState* s, int e) {
  RequestEntry& r = s->entries[e];
  r.status = kFree;
  r.slot = -1;
  r.planned_row = -1;
  s->free_entries[s->free_entry_top++] = e;
}

// Drop a request wherever it is (finished or aborted), returning its blocks, slot and entry.
BLINK_HD inline void finish_entry(SchedState* s, const SchedConfig& c, int e) {
  RequestEntry& r = s->entries[e];
  if (r.status == kRunning) {
    running_remove(s, e);
    release_blocks_and_slot(s, c, e);
  } else if (r.status == kWaiting) {
    waiting_remove(s, c, e);
  }
  free_entry(s, e);
}

// Preemption by recompute: free everything, requeue at the front, recompute prompt + output later.
BLINK_HD inline void preempt(SchedState* s, const SchedConfig& c, int e) {
  running_remove(s, e);
  release_blocks_and_slot(s, c, e);
  RequestEntry& r = s->entries[e];
  r.num_computed = 0;
  r.status = kWaiting;
  waiting_push_front(s, c, e);
  s->preemptions++;
}

BLINK_HD inline int find_entry(const SchedState* s, const SchedConfig& c, uint64_t req_id) {
  for (int e = 0; e < c.max_requests; ++e)
    if (s->entries[e].status != kFree && s->entries[e].desc.req_id == req_id) return e;
  return -1;
}

}  // namespace blink
