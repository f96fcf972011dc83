// Ingress: take request descriptors and aborts off the ring, copy prompts and logit_bias out of the
// arena into the token store, queue requests FCFS. Refused descriptors get an ERROR record; the
// engine stays up. A full request table stops the round (the ring then backs up: backpressure).
#pragma once

#include "sched_grammar.h"

namespace blink {

constexpr int kDescriptorWords = sizeof(RequestDescriptor) / 4;

// Why a descriptor cannot be served (0 = it can). Mirrors LoadedModel.validate_prompt.
BLINK_HD inline int descriptor_problem(const RequestDescriptor& d, const SchedConfig& c, const RingPtrs& rp) {
  if (d.prompt_len == 0 || d.prompt_len >= (uint32_t)c.max_model_len) return 1;
  if (d.num_stop_ids > (uint32_t)kMaxStopIds || d.num_logit_bias > (uint32_t)kMaxLogitBias) return 2;
  if (is_constrained(d) && !grammar_fields_ok(d, c, rp)) return 6;  // its tables are not (validly) staged
  if (prompt_top_for(d) > (c.prompt_logprob_rows > 0 ? kMaxTopLogprobs : -1)) return 7;  // prompt logprobs
  if (d.arena_len != d.prompt_len + 2 * d.num_logit_bias || d.arena_len > rp.arena_capacity) return 3;
  if (d.max_tokens < 1 || d.min_tokens > d.max_tokens) return 4;
  uint64_t longest = (uint64_t)d.prompt_len + d.max_tokens;
  if (longest > (uint64_t)c.max_model_len) longest = c.max_model_len;
  if ((longest + c.block_size - 1) / c.block_size > (uint64_t)c.num_blocks) return 5;
  return 0;
}

BLINK_HD inline void refuse(SchedState* s, const RingPtrs& rp, uint64_t req_id) {
  egress_write(s, rp, req_id, -1, 0, kFinishError);
  set_error(s, rp, kErrInvalidDescriptor);
}

BLINK_HD inline void abort_request(SchedState* s, const SchedConfig& c, const RingPtrs& rp, uint64_t req_id) {
  int e = find_entry(s, c, req_id);
  if (e < 0) return;  // finished already, or never existed: nothing to free, no record
  RequestEntry& r = s->entries[e];
  if (r.status == kStaging)
    for (int j = 0; j < s->num_staged; ++j)
      if (s->staged_entry[j] == e) s->staged_entry[j] = -1;
  egress_write(s, rp, req_id, -1, r.num_generated, kFinishAbort, r.num_cached_tokens);
  finish_entry(s, c, e);
}

// Leader: decide every staged descriptor in ring order (up to a held abort); returns how many were consumed.
BLINK_HD inline int ingest_decide(SchedState* s, const SchedConfig& c, const RingPtrs& rp, uint64_t* arena_end) {
  int consumed = 0;
  for (int i = 0; i < s->num_staged; ++i) s->staged_entry[i] = -1;
  for (int i = 0; i < s->num_staged; ++i) {
    const RequestDescriptor& d = s->staged[i];
    if (d.kind == kKindAbort) {
      // During a forward, the running step may hold the request's row; with records pending, its abort record
      // would overtake its last tokens. Leave the abort (and what follows) in the ring: sched_prepare retries.
      if (s->ingest_in_flight || s->pending_count > 0) {
        s->abort_held = 1;
        break;
      }
      abort_request(s, c, rp, d.req_id);
    } else if (d.kind != kKindRequest) {
      refuse(s, rp, d.req_id);
    } else if (descriptor_problem(d, c, rp)) {
      if (d.arena_len <= rp.arena_capacity) *arena_end = d.arena_offset + d.arena_len;
      refuse(s, rp, d.req_id);
    } else {
      int e = take_entry(s);
      if (e < 0) break;  // table full: leave the rest in the ring
      RequestEntry& r = s->entries[e];
      r.desc = d;
      r.status = kStaging;
      r.slot = -1;
      r.num_generated = r.num_computed = r.num_blocks = r.num_hashed = 0;
      r.num_cached_tokens = -1;
      r.planned_row = -1;
      r.arrived_ns = now_ns();  // per request, not per token: the queue-time metric
      r.queue_us = r.admitted = 0;
      s->staged_entry[i] = e;
      *arena_end = d.arena_offset + d.arena_len;
    }
    consumed = i + 1;
  }
  return consumed;
}

// Team: copy each accepted request's prompt and logit_bias out of the arena, checking token ids.
BLINK_HD inline void ingest_copy(const Team& t, SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  for (int i = 0; i < s->num_staged; ++i) {
    int e = s->staged_entry[i];
    if (e < 0) continue;
    const RequestDescriptor& d = s->staged[i];
    int32_t* dst = entry_tokens(s, c, e);
    int32_t* bias_ids = s->bias_ids + (int64_t)e * kMaxLogitBias;
    int32_t* bias_bits = reinterpret_cast<int32_t*>(s->bias_vals + (int64_t)e * kMaxLogitBias);
    const int prompt = (int)d.prompt_len, nb = (int)d.num_logit_bias, len = (int)d.arena_len;
    // Four independent loads in flight per thread: each is a PCIe round trip from the GPU.
    for (int k0 = t.rank; k0 < len; k0 += 4 * t.size) {
      int32_t v[4];
      for (int u = 0; u < 4; ++u) {
        const int k = k0 + u * t.size;
        v[u] = k < len ? load_volatile(rp.arena + (d.arena_offset + k) % rp.arena_capacity) : 0;
      }
      for (int u = 0; u < 4; ++u) {
        const int k = k0 + u * t.size;
        if (k >= len) break;
        if (k < prompt + nb && (v[u] < 0 || v[u] >= c.vocab_size)) s->staged_bad[i] = 1;
        if (k < prompt) dst[k] = v[u];
        else if (k < prompt + nb) bias_ids[k - prompt] = v[u];
        else bias_bits[k - prompt - nb] = v[u];
      }
    }
  }
}

// Team: one ingest round. Returns (to every rank) whether anything was consumed.
BLINK_HD inline bool ingest(const Team& t, SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  if (t.leader()) {
    const uint64_t tail = s->ingress_tail_valid ? s->ingress_tail_seen : load_acquire(&rp.ingress_header->tail);
    s->ingress_tail_valid = 0;
    const uint64_t avail = tail - s->ingress_head;
    s->num_staged = avail < (uint64_t)kIngestBatch ? (int)avail : kIngestBatch;
  }
  t.sync();
  const int n = load_volatile(&s->num_staged);
  if (n == 0) return false;
  uint32_t* staged = reinterpret_cast<uint32_t*>(s->staged);
  for (int w = t.rank; w < n * kDescriptorWords; w += t.size) {
    const int i = w / kDescriptorWords, k = w % kDescriptorWords;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(&rp.ingress[(s->ingress_head + i) % rp.ingress_capacity]);
    staged[w] = load_volatile(src + k);
  }
  for (int i = t.rank; i < n; i += t.size) s->staged_bad[i] = 0;
  t.sync();
  uint64_t arena_end = s->arena_head;
  if (t.leader()) s->num_consumed = ingest_decide(s, c, rp, &arena_end);
  t.sync();
  ingest_copy(t, s, c, rp);
  t.sync();
  if (t.leader()) {
    for (int i = 0; i < n; ++i) {
      int e = s->staged_entry[i];
      if (e < 0) continue;
      if (s->staged_bad[i]) {
        refuse(s, rp, s->entries[e].desc.req_id);
        free_entry(s, e);
      } else {
        s->entries[e].status = kWaiting;
        waiting_push_back(s, c, e);
      }
    }
    s->num_staged = 0;
    if (arena_end != s->arena_head) {
      s->arena_head = arena_end;
      store_release(&rp.arena_header->head, arena_end);
    }
    s->ingress_head += s->num_consumed;
    store_release(&rp.ingress_header->head, s->ingress_head);
    egress_flush(s, rp);
  }
  t.sync();
  return load_volatile(&s->num_consumed) > 0;
}

}  // namespace blink
