// Sizes and offsets of the structs blink/device/structs.py mirrors, exported by both builds so a
// test can compare them with ctypes.
#pragma once

#include <cstddef>

#include "sched_types.h"

namespace blink {

constexpr int kAbiWords = 18;

inline void abi_layout(uint64_t* out) {
  out[0] = sizeof(SchedConfig);
  out[1] = offsetof(SchedConfig, bucket_tokens);
  out[2] = offsetof(SchedConfig, eos_ids);
  out[3] = offsetof(SchedConfig, step_timeout_ns);
  out[4] = sizeof(StepBufferPtrs);
  out[5] = sizeof(SamplingPtrs);
  out[6] = sizeof(RingPtrs);
  out[7] = sizeof(LoopParams);
  out[8] = offsetof(LoopParams, rings);
  out[9] = offsetof(LoopParams, buffers);
  out[10] = offsetof(LoopParams, sampling);
  out[11] = offsetof(LoopParams, trace);
  out[12] = offsetof(LoopParams, peers);
  out[13] = sizeof(PeerPtrs);
  out[14] = sizeof(PeerTable);
  out[15] = sizeof(FollowerParams);
  out[16] = offsetof(FollowerParams, step_timeout_ns);
  out[17] = sizeof(FollowerState);
}

}  // namespace blink
