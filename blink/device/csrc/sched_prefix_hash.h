// The prefix cache's keys (blink/core/prefix_cache.py computes the same): a block's content hash is
// FNV-1a over its tokens alone, so the team hashes every block at once; the chain state mixes one word
// per block (h_j = (h_{j-1} ^ content_j) * odd), the only sequential part; the index key is the state
// through splitmix64's finalizer. Plus the two atomics the team's match needs, host and device.
#pragma once

#include <cstdint>

#include "platform.h"

namespace blink {

constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ull, kFnvPrime = 0x100000001B3ull;
constexpr uint64_t kChainMul = 0x9E3779B97F4A7C15ull;  // odd: the chain step is a bijection of its parent

// A block's content hash, 64-bit FNV-1a over its token ids alone: every block hashes in parallel.
BLINK_HD inline uint64_t content_hash(const int32_t* tokens, int n) {
  uint64_t h = kFnvOffset;
  for (int i = 0; i < n; ++i) h = (h ^ (uint32_t)tokens[i]) * kFnvPrime;
  return h;
}
// The chain state after a block: one xor-multiply per block is all that stays sequential.
BLINK_HD inline uint64_t chain_state(uint64_t parent, uint64_t content) { return (parent ^ content) * kChainMul; }
BLINK_HD inline uint64_t block_hash(uint64_t parent, const int32_t* tokens, int n) {
  return chain_state(parent, content_hash(tokens, n));
}
// The index key of a state: splitmix64's finalizer (a bijection; the table's low bits must be spread).
BLINK_HD inline uint64_t block_key(uint64_t h) {
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

BLINK_HD inline int32_t prefix_fetch_add(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}
BLINK_HD inline void prefix_atomic_min(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicMin(p, v);
#else
  int32_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

}  // namespace blink
