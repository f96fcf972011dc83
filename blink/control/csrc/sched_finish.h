// After the forward: read each sampling row's token, check stops (blink/engine/stops.py, rule for
// rule), write egress records, free finished requests. Also the failure path for a step that could
// not run (its requests end with ERROR; the engine stays up).
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

// Leader: the forward of the current plan has finished and written its outputs to `b`.
BLINK_HD inline void finish_step(SchedState* s, const SchedConfig& c, const RingPtrs& rp, const StepBufferPtrs& b) {
  for (int row = 0; row < s->plan_rows; ++row) {
    const int e = s->row_entry[row];
    RequestEntry& r = s->entries[e];
    r.planned_row = -1;
    r.num_computed = s->row_start[row] + s->row_len[row];
    if (r.num_computed != entry_num_tokens(r)) continue;  // mid-prefill: nothing sampled
    const int32_t token = (int32_t)load_volatile(b.sampled_ids + row);
    entry_tokens(s, c, e)[entry_num_tokens(r)] = token;
    r.num_generated++;
    s->tokens++;
    const uint32_t reason = check_stop(c, r, token);
    int num_top = r.desc.num_logprobs < 0 ? 0 : r.desc.num_logprobs;
    if (num_top > kMaxTopLogprobs) num_top = kMaxTopLogprobs;
    egress_write(s, rp, r.desc.req_id, token, r.num_generated - 1, reason, load_volatile(b.logprobs + row),
                 num_top, b.top_ids + (int64_t)row * kMaxTopLogprobs, b.top_logprobs + (int64_t)row * kMaxTopLogprobs);
    if (reason != kFinishNone) finish_entry(s, c, e);
  }
  s->plan_rows = s->plan_tokens = 0;
  s->steps++;
  egress_flush(s, rp);
  publish_counters(s, c, rp);
}

// Leader: the step could not run (launch error, no bucket, timeout): fail its requests with a reason.
BLINK_HD inline void fail_step(SchedState* s, const SchedConfig& c, const RingPtrs& rp, int32_t code) {
  set_error(s, rp, code);
  for (int row = 0; row < s->plan_rows; ++row) {
    const int e = s->row_entry[row];
    RequestEntry& r = s->entries[e];
    if (r.status == kFree) continue;
    egress_write(s, rp, r.desc.req_id, -1, r.num_generated, kFinishError);
    finish_entry(s, c, e);
  }
  s->plan_rows = s->plan_tokens = 0;
  egress_flush(s, rp);
  publish_counters(s, c, rp);
}

}  // namespace blink
