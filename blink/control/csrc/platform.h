// What differs between the GPU build (nvcc, one CTA) and the host build (g++, one thread, CPU tests):
// memory ordering on the mapped rings, sleeping, the clock, and how the CTA's threads cooperate.
#pragma once

#include <cstdint>

#include "layout.h"

#if !defined(__CUDA_ARCH__)
#include <time.h>
#endif

namespace blink {

// The threads that run one scheduler: rank 0 decides, all ranks share bulk copies. On the host the
// team is one thread and sync() is nothing, so the same code runs unchanged in the CPU tests.
struct Team {
  int rank;
  int size;
  BLINK_HD bool leader() const { return rank == 0; }
  BLINK_HD void sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
};

// Ring indices written by the other side (host process or GPU): acquire, so the payload read after
// it is at least as new. A plain load could be hoisted out of a polling loop and spin forever.
BLINK_HD inline uint64_t load_acquire(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

// Publish an index after its payload: the payload (in host memory across PCIe) must land first.
BLINK_HD inline void store_release(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

BLINK_HD inline void store_release(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// Memory another agent writes (stop flag, forward outputs): never served from a stale cache line.
template <typename T>
BLINK_HD inline T load_volatile(const T* p) {
  return *reinterpret_cast<const volatile T*>(p);
}
template <typename T>
BLINK_HD inline void store_volatile(T* p, T v) {
  *reinterpret_cast<volatile T*>(p) = v;
}

BLINK_HD inline void atomic_add(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

BLINK_HD inline void pause_ns(uint32_t ns) {
#if defined(__CUDA_ARCH__)
  __nanosleep(ns);
#else
  timespec ts{0, (long)ns};
  nanosleep(&ts, nullptr);
#endif
}

BLINK_HD inline uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

}  // namespace blink
