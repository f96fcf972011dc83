// After the forward: read each sampling row's token, check stops (blink/core/stops.py, rule for
// rule), write egress records, free finished requests. One thread per row for everything per row;
// the leader only counts, frees and publishes. Also the failure path for a step that could not run
// (its requests end with ERROR; the engine stays up).
#pragma once

#include "sched_records.h"

namespace blink {

// Whether `last`, the request's token number `generated` (1-based), stops it (a stop id, or EOS), min_tokens kept.
BLINK_HD inline bool stops_on(const SchedConfig& c, const RequestDescriptor& d, int generated, int32_t last) {
  if (generated - 1 < (int)d.min_tokens) return false;
  for (uint32_t k = 0; k < d.num_stop_ids; ++k)
    if (d.stop_token_ids[k] == last) return true;
  if (!(d.flags & kFlagIgnoreEos))
    for (int k = 0; k < c.num_eos; ++k)
      if (c.eos_ids[k] == last) return true;
  return false;
}

// Whether a request with `generated` tokens out (its last one appended) has reached a length limit.
BLINK_HD inline bool at_length_limit(const SchedConfig& c, const RequestDescriptor& d, int generated) {
  return generated >= (int)d.max_tokens || (int)d.prompt_len + generated >= c.max_model_len;
}

BLINK_HD inline uint32_t check_stop(const SchedConfig& c, const RequestEntry& r, int32_t last) {
  if (stops_on(c, r.desc, r.num_generated, last)) return kFinishStop;
  return at_length_limit(c, r.desc, r.num_generated) ? kFinishLength : kFinishNone;
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

// Team: Scheduler.update_from_output() of blink/core/scheduler.py: the forward of the current plan has
// finished and written its outputs to `b` (buffer set `parity`); append, check stops, finish, write egress. Publishing the
// records (a system fence, ~1-2 us over PCIe) may be left to the caller: the GPU loop does it right
// after launching the next forward, off the critical path, and writes them there too.
// With defer_records, a step without prompt records leaves its token records pending (sched_records.h): the GPU
// loop writes them once the next forward is launched.
BLINK_HD inline void update_from_output(const Team& t, SchedState* s, const SchedConfig& c, const RingPtrs& rp,
                                       const StepBufferPtrs& b, int parity, bool publish_now, bool defer_records) {
  finish_rows(t, s, c, b);
  t.sync();
  if (t.leader()) s->t_rows = now_ns();
  prefix_hash_filled(t, s, c);  // team: keys of the rows that filled several blocks (none: no sync)
  if (t.leader()) {  // record indices (a prefix count over contiguous flags), then the frees
    int n = 0;
    for (int row = 0; row < s->plan_rows; ++row) s->row_record[row] = s->row_record[row] ? n++ : -1;
    s->num_records = n;
    s->tokens += n;
    if (s->num_register > 0)  // before the frees: a finished row's blocks go to the LRU cached
      for (int row = 0; row < s->plan_rows; ++row)
        if (s->row_register[row]) prefix_register(s, c, s->row_entry[row]);
    // Written only when set: on a step without filled rows the team reads num_filled, unsynchronised, as the
    // leader gets here (prefix_hash_filled returns without a barrier then); a store of the same 0 is a race.
    if (s->num_filled) s->num_filled = 0;
    if (s->num_register) s->num_register = 0;
    for (int row = 0; row < s->plan_rows; ++row)
      if (s->row_reason[row] != (int32_t)kFinishNone) finish_entry(s, c, s->row_entry[row]);
    s->t_frees = now_ns();
  }
  t.sync();
  if (defer_records && load_volatile(&s->plan_prompt_rows) == 0) stage_step_records(t, s, parity);
  else write_step_records(t, s, rp, b, parity);
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
