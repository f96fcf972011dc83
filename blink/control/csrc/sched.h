// The scheduler's decision logic over a state struct, compiled for the GPU (scheduler.cu, one CTA)
// and for the host (host_api.cpp, CPU tests). A step is: sched_prepare (ingest, plan, write inputs),
// the forward graph of bucket plan_bucket on buffer set `launched & 1`, then sched_complete.
#pragma once

#include "sched_finish.h"
#include "sched_ingest.h"

namespace blink {

constexpr int kIngestRoundsPerStep = 8;

// Team: everything before the forward. Returns (to every rank) the number of rows; 0 = nothing to run.
BLINK_HD inline int sched_prepare(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  for (int round = 0; round < kIngestRoundsPerStep && ingest(t, s, c, p.rings); ++round) {
  }
  if (t.leader()) {
    plan_step(s, c);
    if (s->plan_rows > 0 && s->plan_bucket < 0) fail_step(s, c, p.rings, kErrNoBucket);
  }
  t.sync();
  const int rows = load_volatile(&s->plan_rows);
  if (rows == 0) return 0;
  write_admissions(t, s, c, p.sampling);
  write_inputs(t, s, c, p.buffers[s->launched & 1]);
  t.sync();
  return rows;
}

// Team: after the forward launched as number `launched - 1` has finished.
BLINK_HD inline void sched_complete(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (t.leader()) finish_step(s, p.cfg, p.rings, p.buffers[(s->launched - 1) & 1]);
  t.sync();
}

}  // namespace blink
