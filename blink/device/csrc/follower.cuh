// Device-mode tensor parallelism, ranks 1..N-1: a resident follower kernel (one warp) in its own
// device-launchable graph. Rank 0's scheduler writes each step's inputs into this rank's buffers and posts
// (step << 32 | bucket) in this rank's mailbox (sched.h post_to_peers); the follower launches the same
// bucket's forward graph on the same buffer parity, fire-and-forget, and waits for its step_done before
// polling again. The all-reduces inside the graphs keep the ranks in lockstep; no host is involved.
#pragma once

#include <cuda_runtime.h>

#include "sched_types.h"

namespace blink {

constexpr uint32_t kFollowerIdleMinNs = 32;
constexpr uint32_t kFollowerIdleMaxNs = 1024;  // a rank that polls late delays every rank's step

__device__ inline void follower_fail(FollowerState* st, int32_t code) {
  st->error_code = code;
  store_release(&st->exited, 1u);
}

__global__ void follower_kernel(const FollowerParams* params) {
  if (threadIdx.x != 0) return;
  const FollowerParams& p = *params;
  FollowerState* st = p.state;
  st->launches_this_kernel = 0;
  uint32_t idle = kFollowerIdleMinNs;
  while (true) {
    const uint64_t word = load_acquire(p.mailbox);
    const uint64_t seq = word >> 32;
    if (seq == st->last_seq) {
      st->heartbeat++;
      pause_ns(idle);
      idle = idle * 2 > kFollowerIdleMaxNs ? kFollowerIdleMaxNs : idle * 2;
      continue;
    }
    idle = kFollowerIdleMinNs;
    st->last_seq = seq;
    const uint32_t command = (uint32_t)word;
    if (command == kPeerStop) {
      store_release(&st->exited, 1u);
      return;
    }
    if (command >= (uint32_t)p.num_buckets) return follower_fail(st, kErrNoBucket);
    cudaGraphExec_t exec = static_cast<cudaGraphExec_t*>(p.graph_execs)[command * 2 + ((seq - 1) & 1)];
    const cudaError_t err = cudaGraphLaunch(exec, cudaStreamGraphFireAndForget);
    if (err != cudaSuccess) return follower_fail(st, kErrLaunchBase + (int32_t)err);
    const uint32_t target = (uint32_t)++st->launched;
    const uint64_t t0 = now_ns();
    while ((int32_t)(load_volatile(&st->done_count) - target) < 0) {
      if ((int64_t)(now_ns() - t0) > p.step_timeout_ns) return follower_fail(st, kErrStepTimeout);
    }
    if (++st->launches_this_kernel >= p.launches_per_kernel) {  // renew the fire-and-forget budget
      const cudaError_t tail = cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
      if (tail != cudaSuccess) follower_fail(st, kErrTailLaunchBase + (int32_t)tail);
      return;
    }
  }
}

}  // namespace blink
