// Egress records of a finished step: its prompt-logprob records, then one token record per sampling row.
// Written at the finish, or (the GPU loop, issue 17's control gap) staged as PendingRecords at the finish and
// written once the next forward is launched, while it runs: the gap between forwards then holds no record
// writes. A step with prompt records writes at once (they read the step's plan, which the next one replaces).
#pragma once

#include "sched_plan.h"

namespace blink {

// Prompt logprobs: record k of the step's prompt rows (StepBuffers.prompt_*): prompt token `index` of its
// row's request, position -index, its rank where a token record has queue_us (transport/layout.py).
BLINK_HD inline void write_prompt_record(const SchedState* s, const RingPtrs& rp, const StepBufferPtrs& b, int k,
                                         uint64_t index_in_ring) {
  const int q = (int)b.prompt_rows[k], row = row_of_query(s, q);
  const RequestEntry& r = s->entries[s->row_entry[row]];
  const int index = s->row_start[row] + q - s->row_qstart[row] + 1;
  write_record(rp, index_in_ring, r.desc.req_id, (int32_t)b.prompt_targets[k], -index, kFinishNone,
               load_volatile(b.prompt_logprob + k), 0, b.prompt_num_top[k], b.prompt_top_ids + (int64_t)k * kMaxTopLogprobs,
               b.prompt_top_logprobs + (int64_t)k * kMaxTopLogprobs, (uint32_t)load_volatile(b.prompt_rank + k));
}

// Team (or the leader alone, as Team{0, 1}): n records, write(k, ring index) each, in as few chunks as the
// ring's room allows (one in steady state); the caller publishes. Returns false if the records were dropped
// (stopping while the reader is gone).
template <typename Write>
BLINK_HD inline bool write_in_chunks(const Team& t, SchedState* s, const RingPtrs& rp, int n, Write write) {
  for (int done = 0; done < n;) {
    if (t.leader()) s->chunk = (int32_t)egress_reserve(s, rp, (uint64_t)(n - done));
    t.sync();
    const int chunk = load_volatile(&s->chunk);
    if (chunk == 0) return false;
    for (int k = done + t.rank; k < done + chunk; k += t.size) write(k, s->egress_tail + (k - done));
    t.sync();
    done += chunk;
    if (t.leader()) {
      s->egress_tail += chunk;
      if (done < n) egress_flush(s, rp);  // the reader makes room only by reading these
    }
  }
  return true;
}

// Team, at the finish: copy what each sampling row's record needs out of its entry (record indices are final;
// entries of finished rows may already be freed: their desc and num_generated remain). parity: the step's
// buffer set, where its tokens stay.
BLINK_HD inline void stage_step_records(const Team& t, SchedState* s, int parity) {
  const int rows = load_volatile(&s->plan_rows);
  for (int row = t.rank; row < rows; row += t.size) {
    const int k = s->row_record[row];
    if (k < 0) continue;
    const RequestEntry& r = s->entries[s->row_entry[row]];
    PendingRecord& pr = s->pending[k];
    pr.req_id = r.desc.req_id;
    pr.position = r.num_generated - 1;
    pr.cached_tokens = r.num_cached_tokens < 0 ? 0 : r.num_cached_tokens;
    pr.reason_top = (uint32_t)s->row_reason[row] | ((uint32_t)num_top_for(r.desc) << 16);
    pr.queue_us = r.num_generated == 1 ? r.queue_us : 0u;
    pr.row = row;
  }
  if (t.leader()) {
    s->pending_count = s->num_records;
    s->pending_parity = parity;
  }
  t.sync();  // every rank has read the plan before the caller clears it
}

// Team (or the leader alone, as Team{0, 1}): write the pending records from their step's buffer set `b` and
// clear them. The caller publishes.
BLINK_HD inline void write_pending_records(const Team& t, SchedState* s, const RingPtrs& rp, const StepBufferPtrs& b) {
  write_in_chunks(t, s, rp, load_volatile(&s->pending_count), [&](int k, uint64_t index) {
    const PendingRecord& pr = s->pending[k];
    write_record(rp, index, pr.req_id, (int32_t)load_volatile(b.sampled_ids + pr.row), pr.position,
                 pr.reason_top & 0xFFFFu, load_volatile(b.logprobs + pr.row), pr.cached_tokens,
                 (int)(pr.reason_top >> 16), b.top_ids + (int64_t)pr.row * kMaxTopLogprobs,
                 b.top_logprobs + (int64_t)pr.row * kMaxTopLogprobs, pr.queue_us);
  });
  if (t.leader() && s->pending_count) s->pending_count = 0;  // none: the team reads it unsynchronised
  t.sync();
}

// Team, at the finish: the step's prompt records (prompt logprobs), then its token records (staged and written
// at once), in row order.
BLINK_HD inline void write_step_records(const Team& t, SchedState* s, const RingPtrs& rp, const StepBufferPtrs& b,
                                        int parity) {
  const bool kept = write_in_chunks(t, s, rp, load_volatile(&s->plan_prompt_rows), [&](int k, uint64_t index) {
    write_prompt_record(s, rp, b, k, index);
  });
  if (!kept) return;  // stopping while the reader is gone: the records are dropped
  stage_step_records(t, s, parity);
  write_pending_records(t, s, rp, b);
}

}  // namespace blink
