// What differs between the GPU build (nvcc, one CTA) and the host build (g++, one thread, CPU tests):
// memory ordering on the mapped rings, sleeping, the clock, and how the CTA's threads cooperate.
#pragma once

#include <cstdint>

#include "layout.h"

#if !defined(__CUDA_ARCH__)
#include <sched.h>
#include <time.h>
#endif

namespace blink {

#if !defined(__CUDA_ARCH__)
// A sense-reversing barrier for host threads standing in for a CTA (CPU tests of the team code). `votes` backs
// Team::sync_or: generation g ORs into votes[g & 1]; whoever completes g clears the other word, which every thread
// read before it arrived here.
struct HostBarrier {
  int size;
  int count;
  int generation;
  int votes[2];
  bool wait(bool vote = false) {
    const int gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (vote) __atomic_fetch_or(&votes[gen & 1], 1, __ATOMIC_ACQ_REL);
    if (__atomic_add_fetch(&count, 1, __ATOMIC_ACQ_REL) == size) {
      __atomic_store_n(&count, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&votes[(gen + 1) & 1], 0, __ATOMIC_RELAXED);
      __atomic_store_n(&generation, gen + 1, __ATOMIC_RELEASE);
    } else {
      while (__atomic_load_n(&generation, __ATOMIC_ACQUIRE) == gen) sched_yield();
    }
    return __atomic_load_n(&votes[gen & 1], __ATOMIC_ACQUIRE) != 0;
  }
};
#endif

// The threads that run one scheduler: rank 0 decides, all ranks share bulk copies. On the GPU they are
// the CTA; on the host one thread (barrier == nullptr) or several host threads with a HostBarrier, so
// the very same code, races included, runs in the CPU tests.
struct Team {
  int rank;
  int size;
  void* barrier;
  BLINK_HD bool leader() const { return rank == 0; }
  BLINK_HD void sync() const {
#if defined(__CUDA_ARCH__)
    if (size > 1) __syncthreads();  // a team of one (the leader alone, on a rare path) has nobody to wait for
#else
    if (barrier) static_cast<HostBarrier*>(barrier)->wait();
#endif
  }
  // A barrier that also tells every rank whether any rank voted: a decision (often the leader's alone) reaches
  // the team without a store and a load of a state word, each an L2 round trip on the GPU loop's critical path.
  BLINK_HD bool sync_or(bool vote) const {
#if defined(__CUDA_ARCH__)
    return size > 1 ? __syncthreads_or(vote) != 0 : vote;
#else
    return barrier ? static_cast<HostBarrier*>(barrier)->wait(vote) : vote;
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

BLINK_HD inline uint32_t load_acquire(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

// Publish an index after its payload: the payload (in host memory across PCIe) must land first. A
// release store at system scope orders every earlier write of this thread before it.
BLINK_HD inline void store_release(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

BLINK_HD inline void store_release(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// Bring a line into the GPU's L2 without waiting for it (the host build has no use for it).
BLINK_HD inline void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Every earlier write of this thread (peer GPU memory included) visible system-wide before later ones.
BLINK_HD inline void fence_system() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// Memory another agent writes (stop flag, forward outputs): never served from a stale cache line.
template <typename T>
BLINK_HD inline T load_volatile(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile T*>(p);
#else
  // On the host the other agent is a thread: a relaxed atomic load, which C++ defines where a volatile read
  // racing with a write is a data race (ThreadSanitizer runs the host build: tools/sanitize_scheduler.sh).
  T value;
  __atomic_load(p, &value, __ATOMIC_RELAXED);
  return value;
#endif
}
// Four consecutive words of such memory in one load (p 16-byte aligned): over PCIe a load costs a round
// trip whatever its width, so copies from host memory move 16 bytes per load.
struct alignas(16) Words4 {
  int32_t w[4];
};
BLINK_HD inline Words4 load_volatile4(const int32_t* p) {
  Words4 r;
#if defined(__CUDA_ARCH__)
  asm volatile("ld.volatile.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
               : "l"(p));
#else
  for (int k = 0; k < 4; ++k) r.w[k] = reinterpret_cast<const volatile int32_t*>(p)[k];
#endif
  return r;
}
template <typename T>
BLINK_HD inline void store_volatile(T* p, T v) {
  *reinterpret_cast<volatile T*>(p) = v;
}

// A store that other team members may make to the same word with the same value (a byte flag): a relaxed atomic
// on the host, where racing plain stores are a data race to C++ (and to ThreadSanitizer).
template <typename T>
BLINK_HD inline void store_relaxed(T* p, T v) {
#if defined(__CUDA_ARCH__)
  *p = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

BLINK_HD inline void atomic_add(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
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
