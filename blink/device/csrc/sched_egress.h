// Egress: token records to the front end, and the live counters in the control block.
// Full ring = backpressure: the scheduler waits (backing off) rather than drop or overwrite a record.
// Records are written with plain stores (any thread) and made visible by one release store of the tail:
// a release at system scope is cumulative, so after the CTA barrier it also orders the other threads'
// record writes before the tail (one system fence per publish, not one per record).
#pragma once

#include "sched_queue.h"

namespace blink {

// Make written records visible: one release store of the tail after their payloads.
BLINK_HD inline void egress_flush(SchedState* s, const RingPtrs& rp) {
  store_release(&rp.egress_header->tail, s->egress_tail);
}

// Free record slots, re-reading the reader's head (a PCIe round trip) only when the cached one shows
// fewer than `want`. Waits (backing off) while the ring is full; returns 0 only when the host asks the
// loop to stop meanwhile, else between 1 and `want`.
BLINK_HD inline uint64_t egress_reserve(SchedState* s, const RingPtrs& rp, uint64_t want) {
  uint64_t room = rp.egress_capacity - (s->egress_tail - s->egress_head_seen);
  if (room >= want) return want;
  s->egress_head_seen = load_acquire(&rp.egress_header->head);
  room = rp.egress_capacity - (s->egress_tail - s->egress_head_seen);
  if (room > 0) return room < want ? room : want;
  egress_flush(s, rp);  // the consumer can only make room by reading what we already wrote
  uint32_t backoff = 128;
  while (s->egress_tail - (s->egress_head_seen = load_acquire(&rp.egress_header->head)) >= rp.egress_capacity) {
    if (load_volatile(&rp.control->stop_flag)) return 0;
    pause_ns(backoff);
    if (backoff < 64000) backoff *= 2;
  }
  room = rp.egress_capacity - (s->egress_tail - s->egress_head_seen);
  return room < want ? room : want;
}

// 16 bytes written as one store: a record header is two PCIe writes instead of seven.
struct alignas(16) RecordWords {
  uint32_t w[4];
};
static_assert(sizeof(TokenRecord) % 16 == 0 && offsetof(TokenRecord, top_ids) == 32, "record header = 32 bytes");

// Write one record at ring index `index` (published by a later egress_flush). No token: token_id -1.
BLINK_HD inline void write_record(const RingPtrs& rp, uint64_t index, uint64_t req_id, int32_t token_id,
                                  int32_t position, uint32_t finish_reason, float logprob, int32_t cached_tokens,
                                  int num_top, const int64_t* top_ids, const float* top_logprobs,
                                  uint32_t queue_us = 0) {
  TokenRecord* rec = &rp.egress[index % rp.egress_capacity];
  uint32_t lp_bits;
  __builtin_memcpy(&lp_bits, &logprob, 4);
  RecordWords h0{{(uint32_t)req_id, (uint32_t)(req_id >> 32), (uint32_t)token_id, (uint32_t)position}};
  RecordWords h1{{finish_reason | ((uint32_t)num_top << 16), (uint32_t)cached_tokens, lp_bits, queue_us}};
  reinterpret_cast<RecordWords*>(rec)[0] = h0;
  reinterpret_cast<RecordWords*>(rec)[1] = h1;
  for (int k = 0; k < num_top; ++k) {
    rec->top_ids[k] = (int32_t)load_volatile(top_ids + k);
    rec->top_logprobs[k] = load_volatile(top_logprobs + k);
  }
}

// Leader, rare paths (refusals, aborts, failed steps): queue one record without tops.
BLINK_HD inline void egress_write(SchedState* s, const RingPtrs& rp, uint64_t req_id, int32_t token_id,
                                  int32_t position, uint32_t finish_reason, int32_t cached_tokens = 0) {
  if (egress_reserve(s, rp, 1) == 0) return;
  write_record(rp, s->egress_tail, req_id, token_id, position, finish_reason, 0.f,
               cached_tokens < 0 ? 0 : cached_tokens, 0, nullptr, nullptr);
  s->egress_tail++;
}

BLINK_HD inline void set_error(SchedState* s, const RingPtrs& rp, int32_t code) {
  s->error_code = code;
  store_volatile(&rp.control->error_code, code);
}

// Leader: live counters for /metrics and /health, and the egress tail, behind one system fence. The
// counters go before the tail's release and the heartbeat after it, so a reader seeing a fresh
// heartbeat sees counters (and records) at least as fresh.
BLINK_HD inline void publish(SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  ControlBlock* ctl = rp.control;
  store_volatile(&ctl->running, (uint32_t)s->running_count);
  store_volatile(&ctl->waiting, (uint32_t)s->waiting_count);
  store_volatile(&ctl->free_kv_blocks, (uint32_t)(s->free_block_top + s->lru_count));  // cached-free: free
  store_volatile(&ctl->total_kv_blocks, (uint32_t)c.num_blocks);
  store_volatile(&ctl->steps, s->steps);
  store_volatile(&ctl->tokens, s->tokens);
  store_volatile(&ctl->preemptions, s->preemptions);
  store_volatile(&ctl->prefix_cache_queries, s->prefix_queries);
  store_volatile(&ctl->prefix_cache_hits, s->prefix_hits);
  store_volatile(&ctl->prefix_cache_resets, s->resets_done);
  egress_flush(s, rp);
  s->heartbeat++;
  store_volatile(&ctl->heartbeat, s->heartbeat);
}

}  // namespace blink
