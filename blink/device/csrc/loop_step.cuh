// The GPU loop's step around its forward graph (scheduler.cu): launch it, then wait for it while the team
// ingests what arrives. Device code only; the decisions before and after are in sched.h (host-testable).
#pragma once

#include <cuda_runtime.h>

#include "sched_ahead.h"
#include "sched_idle.h"
#include "sched_pace.h"

namespace blink {

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Leader: while a forward runs, fetch what the next step would otherwise read over PCIe on its critical
// path (read_host_words). Called in the wait loop, so the last call before the forward completes is the fresh one.
__device__ inline void prefetch_host_words(const LoopParams& p) { read_host_words(p.state, p.rings); }

// Leader: launch the planned step's forward graph (ahead: the step take_ahead let go, planned from the last one;
// its graph `exec` was read before the wait). Returns whether it launched. On failure the step's requests end with
// ERROR (fail_planned_step: plan_rows is then 0) and the loop goes on; a step launched ahead is instead planned and
// launched again the synchronous way. Relaunching each step, the forward's completion is left to the next instance:
// a tail launch starts only once the forward is done.
__device__ inline bool launch_step(const LoopParams& p, bool ahead, void* exec_ahead = nullptr) {
  SchedState* s = p.state;
  const int parity = (int)(s->launched & 1);
  const int index = graph_exec_index(p.cfg, s->plan_bucket, s->plan_searchless, parity);
  cudaGraphExec_t exec = ahead ? static_cast<cudaGraphExec_t>(exec_ahead)
                               : static_cast<cudaGraphExec_t*>(p.graph_execs)[index];
  uint64_t* trace = trace_row(p, s->launched);
  __threadfence();  // the step's inputs (written by the whole CTA, then __syncthreads) before the launch
  const uint64_t t0 = now_ns();
  // The self-test's injected failure goes through exactly the path a real launch error takes.
  const bool injected = p.hooks != nullptr && s->plan_bucket == p.hooks->fail_bucket;
  const cudaError_t err = injected ? cudaErrorLaunchFailure
                                                              : cudaGraphLaunch(exec, cudaStreamGraphFireAndForget);
  const uint64_t t1 = now_ns();
  if (err != cudaSuccess) {
    if (!ahead) fail_planned_step(p, kErrLaunchBase + (int32_t)err);
    return false;
  }
  s->launched++;
  s->launches_this_kernel++;
  post_to_peers(p, s->launched, (uint32_t)s->plan_bucket);  // after our launch: a failed one posts nothing
  trace[0] = t0;
  trace[2] = ((uint64_t)s->plan_tokens << 32) | (uint32_t)s->plan_rows;
  trace[4] = s->t_ingest;
  trace[5] = s->t_plan;
  trace[6] = s->t_inputs;
  trace[7] = t1;
  trace[10] = s->t_scheduled;
  trace[11] = ahead;
  if (p.hooks != nullptr && p.hooks->relaunch_each_step) s->pending_complete = 1;
  return true;
}

// Team: wait for the forward launched last (relaunching each step, the next instance does). The leader polls
// the completion counter and, between polls, re-reads the host words, so when the forward is done the ingress
// tail in hand is at most one PCIe round trip old: a request that arrived while the forward ran is planned into
// the very next step. (Read once after the launch, as before 2026-12-01, it made every request that arrived
// during a forward wait one more step: under load, nearly all.) When the tail has moved, the team ingests while
// the forward runs (issue 17's control gap: the descriptor and prompt reads leave the gap), unless an abort is
// held for the gap. `a`: the inputs written ahead, whose checks stay warm. Returns (to every rank) whether the
// step is over without its forward's output: a timeout failed it, or the next instance completes it.
__device__ inline bool wait_step(const Team& t, const LoopParams& p, bool ingest, const AheadPlan& a) {
  SchedState* s = p.state;
  if (load_volatile(&s->pending_complete)) return true;
  uint64_t* trace = trace_row(p, s->launched - 1);
  const uint64_t t0 = trace[0];
  const uint32_t target = (uint32_t)s->launched;
  enum { kPoll = 0, kDone = 1, kIngest = 2, kTimedOut = 3 };
  const bool warm = p.hooks == nullptr || !p.hooks->no_warm_ahead;  // the self-test's A/B
  bool stalled = false;  // leader: a round took nothing (a full request table): no more until the gap
  while (true) {
    int turn = kPoll;
    if (t.leader()) {
      if ((int32_t)(load_acquire_gpu(&s->done_count) - target) >= 0) {
        turn = kDone;
        trace[1] = now_ns();
      } else if ((int64_t)(now_ns() - t0) > p.cfg.step_timeout_ns) {
        fail_planned_step(p, kErrStepTimeout);
        turn = kTimedOut;
      } else {
        prefetch_host_words(p);
        if (ingest && !stalled && s->ingress_tail_seen != s->ingress_head && !s->abort_held) turn = kIngest;
      }
    }
    // The end of the wait travels in the barrier itself: the gap starts with no state word to store and load.
    if (t.sync_or(turn == kDone || turn == kTimedOut)) return t.sync_or(turn == kTimedOut);
    if (warm) warm_ahead(t, s, a);
    if (t.sync_or(turn == kIngest)) {
      const uint64_t head = s->ingress_head;  // read before the team's round (only the leader uses it)
      ingest_while_running(t, p);
      if (t.leader()) {
        stalled = s->ingress_head == head;
        prefetch_host_words(p);  // ingest used the tail: the gap must find a fresh one
      }
    }
  }
}

}  // namespace blink
