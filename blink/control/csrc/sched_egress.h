// Egress: token records to the front end, and the live counters in the control block.
// Full ring = backpressure: the scheduler waits (backing off) rather than drop or overwrite a record.
#pragma once

#include "sched_queue.h"

namespace blink {

// Make written records visible: one release store of the tail after their payloads.
BLINK_HD inline void egress_flush(SchedState* s, const RingPtrs& rp) {
  store_release(&rp.egress_header->tail, s->egress_tail);
}

// Wait for a free egress slot. Returns false only when the host asks the loop to stop meanwhile.
// The reader's head is re-read (over PCIe) only when the cached one says the ring is full.
BLINK_HD inline bool egress_wait_room(SchedState* s, const RingPtrs& rp) {
  if (s->egress_tail - s->egress_head_seen < rp.egress_capacity) return true;
  s->egress_head_seen = load_acquire(&rp.egress_header->head);
  if (s->egress_tail - s->egress_head_seen < rp.egress_capacity) return true;
  egress_flush(s, rp);  // the consumer can only make room by reading what we already wrote
  uint32_t backoff = 128;
  while (s->egress_tail - (s->egress_head_seen = load_acquire(&rp.egress_header->head)) >= rp.egress_capacity) {
    if (load_volatile(&rp.control->stop_flag)) return false;
    pause_ns(backoff);
    if (backoff < 64000) backoff *= 2;
  }
  return true;
}

// Queue one record (published by the next egress_flush). A record with no token has token_id -1.
BLINK_HD inline void egress_write(SchedState* s, const RingPtrs& rp, uint64_t req_id, int32_t token_id,
                                  int32_t position, uint32_t finish_reason, float logprob = 0.f,
                                  int num_top = 0, const int64_t* top_ids = nullptr,
                                  const float* top_logprobs = nullptr) {
  if (!egress_wait_room(s, rp)) return;
  TokenRecord* rec = &rp.egress[s->egress_tail % rp.egress_capacity];
  rec->req_id = req_id;
  rec->token_id = token_id;
  rec->position = position;
  rec->finish_reason = finish_reason;
  rec->num_top = (uint32_t)num_top;
  rec->logprob = logprob;
  rec->_pad = 0;
  for (int k = 0; k < num_top; ++k) {
    rec->top_ids[k] = (int32_t)load_volatile(top_ids + k);
    rec->top_logprobs[k] = load_volatile(top_logprobs + k);
  }
  s->egress_tail++;
}

BLINK_HD inline void set_error(SchedState* s, const RingPtrs& rp, int32_t code) {
  s->error_code = code;
  store_volatile(&rp.control->error_code, code);
}

// Live counters for /metrics and /health; the heartbeat goes last so a reader seeing it fresh sees
// counters at least as fresh.
BLINK_HD inline void publish_counters(SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  ControlBlock* ctl = rp.control;
  store_volatile(&ctl->running, (uint32_t)s->running_count);
  store_volatile(&ctl->waiting, (uint32_t)s->waiting_count);
  store_volatile(&ctl->free_kv_blocks, (uint32_t)s->free_block_top);
  store_volatile(&ctl->total_kv_blocks, (uint32_t)c.num_blocks);
  store_volatile(&ctl->steps, s->steps);
  store_volatile(&ctl->tokens, s->tokens);
  store_volatile(&ctl->preemptions, s->preemptions);
  s->heartbeat++;
  store_release(&ctl->heartbeat, s->heartbeat);
}

}  // namespace blink
