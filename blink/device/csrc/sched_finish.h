// After the forward: read each sampling row's token, check stops (blink/core/stops.py, rule for
// rule), write egress records, free finished requests. One thread per row for everything per row;
// the leader only counts, frees and publishes. Also the failure path for a step that could not run
// (its requests end with ERROR; the engine stays up).
#pragma once

#include "sched_plan.h"

namespace blink {

BLINK_HD inline uint32_t check_stop(const SchedConfig& c, const RequestEntry& r, int32_t last) {
  const RequestDescriptor& d = r.desc;
  if (r.num_generated - 1 >= (int)d.min_tokens) {
    for (uint32_t k = 0; k < d.num_stop_ids; ++k)
      if (d.stop_token_ids[k] == last) return kFinishStop;
    if (!(d.flags & kFlagIgnoreEos))
      for (int k = 0; k < c.num_eos; ++k)
        if (c.eos_ids[k] == last) return kFinishStop;
  }
  if (r.num_generated >= (int)d.max_tokens || entry_num_tokens(r) >= c.max_model_len) return kFinishLength;
  return kFinishNone;
}

// Team, one thread per row: the row's entry advances; a sampling row appends its token and checks stops.
BLINK_HD inline void finish_rows(const Team& t, SchedState* s, const SchedConfig& c, const StepBufferPtrs& b) {
  for (int row = t.rank; row < s->plan_rows; row += t.size) {
    const int e = s->row_entry[row];
    RequestEntry& r = s->entries[e];
    r.planned_row = -1;
    r.num_computed = s->row_start[row] + s->row_len[row];
    uint32_t reason = kFinishNone;
    int samples = r.num_computed == entry_num_tokens(r);  // else mid-prefill: nothing sampled
    if (samples) {
      const int32_t token = (int32_t)load_volatile(b.sampled_ids + row);
      entry_tokens(s, c, e)[entry_num_tokens(r)] = token;
      r.num_generated++;
      reason = check_stop(c, r, token);
    }
    s->row_register[row] = prefix_note_row(s, c, e, row);
    s->row_record[row] = samples;
    s->row_reason[row] = (int32_t)reason;
  }
}

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

// Team: the step's prompt records (prompt logprobs), then the sampling rows' records, in row order, in as
// few chunks as the ring's room allows (one in steady state). Entries of finished rows may already be
// freed: their desc and num_generated remain.
BLINK_HD inline void write_step_records(const Team& t, SchedState* s, const RingPtrs& rp, const StepBufferPtrs& b) {
  const int rows = load_volatile(&s->plan_rows), np = load_volatile(&s->plan_prompt_rows);
  const int n = np + load_volatile(&s->num_records);
  for (int done = 0; done < n;) {
    if (t.leader()) s->chunk = (int32_t)egress_reserve(s, rp, (uint64_t)(n - done));
    t.sync();
    const int chunk = load_volatile(&s->chunk);
    if (chunk == 0) return;  // stopping while the reader is gone: the records are dropped
    for (int k = done + t.rank; k < np && k < done + chunk; k += t.size)
      write_prompt_record(s, rp, b, k, s->egress_tail + (k - done));
    for (int row = t.rank; row < rows; row += t.size) {
      const int k = np + s->row_record[row] - done;
      if (s->row_record[row] < 0 || k < 0 || k >= chunk) continue;
      const RequestEntry& r = s->entries[s->row_entry[row]];
      const int num_top = num_top_for(r.desc);
      write_record(rp, s->egress_tail + k, r.desc.req_id, (int32_t)load_volatile(b.sampled_ids + row),
                   r.num_generated - 1, (uint32_t)s->row_reason[row], load_volatile(b.logprobs + row),
                   r.num_cached_tokens < 0 ? 0 : r.num_cached_tokens, num_top,
                   b.top_ids + (int64_t)row * kMaxTopLogprobs, b.top_logprobs + (int64_t)row * kMaxTopLogprobs,
                   r.num_generated == 1 ? r.queue_us : 0u);
    }
    t.sync();
    done += chunk;
    if (t.leader()) {
      s->egress_tail += chunk;
      if (done < n) egress_flush(s, rp);  // the reader makes room only by reading these
    }
  }
}

// Team: Scheduler.update_from_output() of blink/core/scheduler.py: the forward of the current plan has
// finished and written its outputs to `b`; append, check stops, finish, write egress. Publishing the
// records (a system fence, ~1-2 us over PCIe) may be left to the caller: the GPU loop does it right
// after launching the next forward, off the critical path.
BLINK_HD inline void update_from_output(const Team& t, SchedState* s, const SchedConfig& c, const RingPtrs& rp,
                                       const StepBufferPtrs& b, bool publish_now) {
  finish_rows(t, s, c, b);
  t.sync();
  prefix_hash_filled(t, s, c);  // team: keys of the rows that filled several blocks (none: no sync)
  if (t.leader()) {  // record indices (a prefix count over contiguous flags), then the frees
    int n = 0;
    for (int row = 0; row < s->plan_rows; ++row) s->row_record[row] = s->row_record[row] ? n++ : -1;
    s->num_records = n;
    s->tokens += n;
    if (s->num_register > 0)  // before the frees: a finished row's blocks go to the LRU cached
      for (int row = 0; row < s->plan_rows; ++row)
        if (s->row_register[row]) prefix_register(s, c, s->row_entry[row]);
    s->num_filled = s->num_register = 0;
    for (int row = 0; row < s->plan_rows; ++row)
      if (s->row_reason[row] != (int32_t)kFinishNone) finish_entry(s, c, s->row_entry[row]);
  }
  t.sync();
  write_step_records(t, s, rp, b);
  if (t.leader()) {
    const int bucket = iteration_bucket(s->plan_tokens);  // two posted stores: /metrics' step-size histogram
    store_volatile(&rp.control->iteration_tokens[bucket], ++s->iteration_tokens[bucket]);
    store_volatile(&rp.control->iteration_tokens_sum, s->iteration_tokens_sum += s->plan_tokens);
    s->plan_rows = s->plan_tokens = s->plan_prompt_rows = 0;
    s->steps++;
    if (publish_now) publish(s, c, rp);
  }
  t.sync();
}

// Leader: the step could not run (launch error, no bucket, timeout): fail its requests with a reason.
BLINK_HD inline void fail_step(SchedState* s, const SchedConfig& c, const RingPtrs& rp, int32_t code) {
  set_error(s, rp, code);
  for (int row = 0; row < s->plan_rows; ++row) {
    const int e = s->row_entry[row];
    RequestEntry& r = s->entries[e];
    r.planned_row = -1;
    if (r.status == kFree) continue;
    egress_write(s, rp, r.desc.req_id, -1, r.num_generated, kFinishError, r.num_cached_tokens);
    finish_entry(s, c, e);
  }
  s->plan_rows = s->plan_tokens = s->plan_prompt_rows = 0;
  publish(s, c, rp);
}

}  // namespace blink
