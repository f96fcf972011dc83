// The scheduler's decision logic over a state struct, compiled for the GPU (scheduler.cu, one CTA)
// and for the host (host_api.cpp, CPU tests). A step is: sched_prepare (ingest, schedule, write inputs),
// the forward graph of bucket plan_bucket on buffer set `launched & 1`, then sched_complete
// (update_from_output). schedule / update_from_output are the Python Scheduler's two phases, by name.
#pragma once

#include "sched_finish.h"
#include "sched_prefix.h"
#include "sched_ingest.h"

namespace blink {

constexpr int kIngestRoundsPerStep = 8;

// Team: everything before the forward. Returns (to every rank) the number of rows; 0 = nothing to run.
// The leader stamps each phase's end (s->t_*) for the launch's trace row.
BLINK_HD inline int sched_prepare(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  // POST /reset_prefix_cache: the front end bumps a command word; we apply it between steps. The word
  // is prefetched with the ingress tail while a forward runs, else read here (idle: no hurry).
  if (t.leader() && !s->ingress_tail_valid) s->resets_seen = load_volatile(&p.rings.control->reset_prefix_cache);
  t.sync();
  if (load_volatile(&s->resets_seen) != load_volatile(&s->resets_done)) {
    prefix_reset(t, s, c);
    if (t.leader()) s->resets_done = s->resets_seen;
    t.sync();
  }
  for (int round = 0; round < kIngestRoundsPerStep && ingest(t, s, c, p.rings); ++round) {
  }
  if (t.leader()) s->t_ingest = now_ns();
  schedule(t, s, c);
  t.sync();
  prefix_apply_shares(t, s, c);  // the team's part of the admissions (issue 16); before any frees
  if (load_volatile(&s->plan_rows) > 0 && load_volatile(&s->plan_bucket) < 0) {  // the same on every rank
    if (t.leader()) fail_step(s, c, p.rings, kErrNoBucket);
    t.sync();
  }
  const int rows = load_volatile(&s->plan_rows);
  if (rows == 0) {
    if (t.leader()) s->busy_since_ns = 0;  // idle: the time until the next step is not a busy interval
    return 0;
  }
  write_admissions(t, s, c, p.sampling, p.rings);
  if (t.leader()) s->t_plan = now_ns();
  write_inputs(t, s, c, p.buffers[s->launched & 1]);
  if (p.peers != nullptr) {  // the other TP ranks' copies, straight into their memory
    for (int k = 0; k < p.peers->num_peers; ++k) write_inputs(t, s, c, p.peers->peers[k].buffers[s->launched & 1]);
    fence_system();  // this thread's peer writes land before the leader posts the mailboxes
  }
  t.sync();
  if (t.leader()) s->t_inputs = now_ns();
  return rows;
}

// Leader, on an idle turn only (no PCIe reads per step): true once the drain is over. The front end
// raises ingress_closed after its last descriptor, so a tail read after the flag is final; everything
// up to it was ingested and has finished (the records are published as the loop exits).
BLINK_HD inline bool drain_done(const SchedState* s, const RingPtrs& rp) {
  if (s->running_count != 0 || s->waiting_count != 0) return false;
  if (load_acquire(&rp.control->ingress_closed) == 0) return false;
  return load_acquire(&rp.ingress_header->tail) == s->ingress_head;
}

// Leader: tell the other TP ranks to run step `seq` (1-based launch number) with `command` (a bucket, or
// kPeerStop). Release at system scope: the inputs written before (fenced by every writer) land first.
BLINK_HD inline void post_to_peers(const LoopParams& p, uint64_t seq, uint32_t command) {
  if (p.peers == nullptr) return;
  for (int k = 0; k < p.peers->num_peers; ++k) store_release(p.peers->peers[k].mailbox, (seq << 32) | command);
}

// Team: after the forward launched as number `launched - 1` has finished. publish_now = false: the
// caller publishes (records and counters) soon, on every path (next launch, idle, failure, exit).
BLINK_HD inline void sched_complete(const Team& t, const LoopParams& p, bool publish_now) {
  SchedState* s = p.state;
  update_from_output(t, s, p.cfg, p.rings, p.buffers[(s->launched - 1) & 1], publish_now);
  if (t.leader()) {
    s->t_finish = now_ns();
    if (p.trace) p.trace[((s->launched - 1) % (uint64_t)p.cfg.trace_capacity) * kTraceWords + 3] = s->t_finish;
    if (s->busy_since_ns != 0) {  // two posted stores: /metrics' busy step interval histogram
      const uint64_t ns = s->t_finish - s->busy_since_ns;
      const int bucket = step_interval_bucket(ns);
      store_volatile(&p.rings.control->step_intervals[bucket], ++s->step_intervals[bucket]);
      store_volatile(&p.rings.control->step_intervals_sum_ns, s->step_intervals_sum_ns += ns);
    }
    s->busy_since_ns = s->t_finish;
  }
}

}  // namespace blink
