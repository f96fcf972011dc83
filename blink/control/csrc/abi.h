// Sizes and offsets of the structs blink/control/structs.py mirrors, exported by both builds so a
// test can compare them with ctypes.
#pragma once

#include <cstddef>

#include "sched_types.h"

namespace blink {

constexpr int kAbiWords = 12;

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
}

}  // namespace blink
