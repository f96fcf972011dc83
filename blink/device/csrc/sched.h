// The scheduler's decision logic over a state struct, compiled for the GPU (scheduler.cu, one CTA)
// and for the host (host_api.cpp, CPU tests). A step is: sched_prepare (ingest, schedule, write inputs),
// the forward graph of bucket plan_bucket (its variant: plan_searchless) on buffer set `launched & 1`, then
// sched_complete (update_from_output). schedule / update_from_output are the Python Scheduler's two phases, by name.
#pragma once

#include "sched_finish.h"
#include "sched_prefix.h"
#include "sched_ingest.h"
#include "sched_variant.h"

namespace blink {

constexpr int kIngestRoundsPerStep = 8;

// The trace row (kTraceWords) of launch number `launch`, counted from 0. The GPU loop always has a trace.
BLINK_HD inline uint64_t* trace_row(const LoopParams& p, uint64_t launch) {
  return p.trace + (launch % (uint64_t)p.cfg.trace_capacity) * kTraceWords;
}

// Team: write the last step's pending records (none: nothing to do; the same on every rank).
BLINK_HD inline void flush_pending_records(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (load_volatile(&s->pending_count) == 0) return;
  write_pending_records(t, s, p.rings, p.buffers[s->pending_parity & 1]);
}

// Leader: the planned step cannot run. The last step's pending records go first: a request in both steps
// must see its tokens before its ERROR.
BLINK_HD inline void fail_planned_step(const LoopParams& p, int32_t code) {
  flush_pending_records(Team{0, 1, nullptr}, p);
  fail_step(p.state, p.cfg, p.rings, code);
}

// Leader: read what the next plan needs from the host over PCIe (loads in flight at once: one round trip): the
// ingress tail, the stop flag and the prefix-cache reset word. The plan then uses them (ingress_tail_valid).
BLINK_HD inline void read_host_words(SchedState* s, const RingPtrs& rp) {
  // every load before the first store: a store waits for its value, which would serialise the round trips
  const uint64_t tail = load_acquire(&rp.ingress_header->tail);
  const uint32_t stop = load_volatile(&rp.control->stop_flag);
  const uint32_t resets = load_volatile(&rp.control->reset_prefix_cache);
  s->ingress_tail_seen = tail;
  s->stop_seen = stop != 0;
  s->resets_seen = resets;
  s->ingress_tail_valid = 1;
}

// Team: ingest rounds until one consumes nothing. A held abort (sched_ingest.h) is retried once the pending
// records are written, so that it lands after its request's last tokens. abort_held is written by the leader
// only (ingest_decide, and here past a sync), so the path without a held abort costs no extra sync; a stale
// flag costs one empty round after an abort.
BLINK_HD inline void ingest_rounds(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  for (int round = 0; round < kIngestRoundsPerStep && ingest(t, s, p.cfg, p.rings); ++round) {
  }
  if (!load_volatile(&s->abort_held) || load_volatile(&s->ingest_in_flight)) return;  // read after ingest's sync
  t.sync();  // every rank has read the flags before the leader clears one
  flush_pending_records(t, p);
  if (t.leader()) s->abort_held = 0;
  t.sync();
  for (int round = 0; round < kIngestRoundsPerStep && ingest(t, s, p.cfg, p.rings); ++round) {
  }
}

// Team, while a forward runs: take in the requests that arrived. Aborts wait for the gap (ingest_rounds).
BLINK_HD inline void ingest_while_running(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (t.leader()) s->ingest_in_flight = 1;
  t.sync();
  ingest_rounds(t, p);
  t.sync();  // every rank has read the flag
  if (t.leader()) s->ingest_in_flight = 0;  // read next after more syncs
}

// Team, right after a launch (the GPU loop; the host tests call it in the same place): write the last step's
// records, then, with `ingest`, take in the requests that arrived, so that the gap between this forward and
// the next has neither to do. (The GPU loop goes on ingesting while it waits: scheduler.cu wait_step.)
BLINK_HD inline void work_during_forward(const Team& t, const LoopParams& p, bool ingest) {
  flush_pending_records(t, p);
  if (ingest) ingest_while_running(t, p);
}

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
  ingest_rounds(t, p);
  if (t.leader()) s->t_ingest = now_ns();
  schedule(t, s, c);
  t.sync();
  prefix_apply_shares(t, s, c);  // the team's part of the admissions (issue 16); before any frees
  if (load_volatile(&s->plan_rows) > 0 && load_volatile(&s->plan_bucket) < 0) {  // the same on every rank
    if (t.leader()) fail_planned_step(p, kErrNoBucket);
    t.sync();
  }
  plan_variant(t, s, c);  // the bucket's graph with or without the sampler's search (sched_variant.h)
  if (t.leader()) s->t_scheduled = now_ns();
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

// Team: after the forward launched as number `launch` has finished: `launched - 1`, or `launched - 2` when the
// next step was launched ahead (sched_ahead.h). publish_now = false: the caller publishes (records and counters)
// soon, on every path (next launch, idle, failure, exit). defer_records: the caller writes the step's records
// later too (flush_pending_records, on the same paths).
BLINK_HD inline void complete_launch(const Team& t, const LoopParams& p, bool publish_now, bool defer_records,
                                     uint64_t launch) {
  SchedState* s = p.state;
  flush_pending_records(t, p);  // an earlier step's, if a path left them (none on the GPU loop's paths)
  const int parity = (int)(launch & 1);
  update_from_output(t, s, p.cfg, p.rings, p.buffers[parity], parity, publish_now, defer_records);
  if (t.leader()) {
    s->t_finish = now_ns();
    if (p.trace) {
      uint64_t* row = trace_row(p, launch);
      row[3] = s->t_finish;
      row[8] = s->t_rows;
      row[9] = s->t_frees;
    }
    if (s->busy_since_ns != 0) {  // two posted stores: /metrics' busy step interval histogram
      const uint64_t ns = s->t_finish - s->busy_since_ns;
      const int bucket = step_interval_bucket(ns);
      store_volatile(&p.rings.control->step_intervals[bucket], ++s->step_intervals[bucket]);
      store_volatile(&p.rings.control->step_intervals_sum_ns, s->step_intervals_sum_ns += ns);
    }
    s->busy_since_ns = s->t_finish;
  }
}

// Team: the forward launched last (number `launched - 1`) has finished.
BLINK_HD inline void sched_complete(const Team& t, const LoopParams& p, bool publish_now, bool defer_records) {
  complete_launch(t, p, publish_now, defer_records, p.state->launched - 1);
}

}  // namespace blink
