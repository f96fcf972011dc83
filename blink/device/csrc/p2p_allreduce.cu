// One-shot all-reduces (sum) of bf16 over the tensor-parallel ranks of one host, through peer memory:
// the alternatives to NCCL's all-reduce (issue 7: measure both). Every rank's arena
// (blink/parallel/p2p_allreduce.py) holds, in its own GPU memory:
//   stage[2][world][max_elems] bf16      push kernel: peers push their inputs here (slot = their rank)
//   flags[2][max_blocks][world] u32      push kernel: peer r sets flags[par][b][r] = epoch once chunk b is in
//   epochs[max_blocks] u32               push kernel: this rank's call count per block (never shared)
//   lines[2][world][ll_max_elems / 4]    LL kernel: 16-byte lines {data, flag, data, flag}
//   ll_state[2] u64                      LL kernel: calls completed, blocks done in the current call
//
// Push kernel, block b: push this rank's chunk b into every peer's stage slot, fence at system scope,
// raise our flag in every peer, wait for every peer's flag in our memory, then sum the chunk in rank
// order (the same bits on every rank). Parity = epoch & 1: a peer reaches call e+2 (which reuses parity
// e & 1) only after our flag of call e+1, which we raise after we finished reading call e.
//
// LL kernel (NCCL's low-latency protocol, our own code): each 8 bytes of payload travel in one 16-byte
// store with a flag beside each 4 bytes, so the reader polls the data itself and no fence or separate
// flag write is needed: one one-way NVLink trip per call. The flag is the call number (never 0);
// parity = call & 1 by the argument above (a peer starts call e+2 only after it read all of our call
// e+1, which we wrote after our call e kernel had finished).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace {

constexpr int kMaxWorld = 8;
constexpr int kThreads = 512;

struct P2PAllReduceParams {
  int32_t world;
  int32_t rank;
  int64_t max_elems;  // push kernel, per slot
  int32_t max_blocks;
  int32_t reserved;
  __nv_bfloat16* stage[kMaxWorld];  // each rank's stage base, as mapped in this process (ours included)
  uint32_t* flags[kMaxWorld];       // each rank's flags base, likewise
  uint32_t* epochs;                 // ours
  int64_t ll_max_elems;             // LL kernel, per slot
  uint4* lines[kMaxWorld];          // each rank's LL lines base, as mapped here
  unsigned long long* ll_state;     // ours: [0] calls completed, [1] blocks done in this call
};

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void store_line(uint4* p, uint2 v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(flag), "r"(v.y),
               "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 load_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void add4(float* acc, uint2 v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    acc[2 * k] += f.x;
    acc[2 * k + 1] += f.y;
  }
}

__device__ __forceinline__ void add8(float* acc, uint4 v) {
  add4(acc, make_uint2(v.x, v.y));
  add4(acc + 4, make_uint2(v.z, v.w));
}

__global__ void __launch_bounds__(kThreads) p2p_allreduce_kernel(const P2PAllReduceParams* params,
                                                                 const uint4* in, uint4* out, int64_t vecs) {
  const P2PAllReduceParams& p = *params;
  const int b = blockIdx.x, t = threadIdx.x;
  const uint32_t epoch = p.epochs[b] + 1;
  const int par = (int)(epoch & 1);
  const int64_t per = (vecs + gridDim.x - 1) / gridDim.x;
  const int64_t lo = b * per, hi = lo + per < vecs ? lo + per : vecs;
  const int64_t slot_vecs = p.max_elems / 8;

  for (int j = 0; j < p.world; ++j) {  // push our chunk into every peer's slot `rank`
    if (j == p.rank) continue;
    uint4* dst = reinterpret_cast<uint4*>(p.stage[j]) + ((int64_t)par * p.world + p.rank) * slot_vecs;
    for (int64_t i = lo + t; i < hi; i += blockDim.x) dst[i] = in[i];
  }
  __threadfence_system();
  __syncthreads();
  if (t < p.world && t != p.rank) {
    store_release_sys(p.flags[t] + ((int64_t)par * p.max_blocks + b) * kMaxWorld + p.rank, epoch);
    const uint32_t* mine = p.flags[p.rank] + ((int64_t)par * p.max_blocks + b) * kMaxWorld + t;
    while (load_acquire_sys(mine) != epoch) {
    }
  }
  __syncthreads();
  __threadfence_system();  // every thread orders its stage loads after the flags the waiters saw

  const uint4* stage = reinterpret_cast<const uint4*>(p.stage[p.rank]) + (int64_t)par * p.world * slot_vecs;
  for (int64_t i = lo + t; i < hi; i += blockDim.x) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < p.world; ++j)  // rank order: bitwise the same sum on every rank
      add8(acc, j == p.rank ? in[i] : __ldcg(stage + (int64_t)j * slot_vecs + i));
    uint4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
    out[i] = r;
  }
  if (t == 0) p.epochs[b] = epoch;
}


__global__ void __launch_bounds__(kThreads) p2p_allreduce_ll_kernel(const P2PAllReduceParams* params,
                                                                    const uint2* in, uint2* out, int64_t units) {
  const P2PAllReduceParams& p = *params;
  const unsigned long long call = p.ll_state[0];
  const uint32_t flag = 1u + (uint32_t)(call % 0xFFFFFFFFull);  // never 0, the arena's initial value
  const int64_t par = (int64_t)(call & 1);
  const int64_t slot_lines = p.ll_max_elems / 4;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;

  for (int64_t i = first; i < units; i += stride) {  // push every line first, so peers wait once
    const uint2 v = in[i];
    for (int j = 0; j < p.world; ++j)
      if (j != p.rank) store_line(p.lines[j] + (par * p.world + p.rank) * slot_lines + i, v, flag);
  }
  for (int64_t i = first; i < units; i += stride) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < p.world; ++j) {  // rank order: bitwise the same sum on every rank
      if (j == p.rank) {
        add4(acc, in[i]);
        continue;
      }
      const uint4* src = p.lines[p.rank] + (par * p.world + j) * slot_lines + i;
      uint4 line = load_line(src);
      while (line.y != flag || line.w != flag) line = load_line(src);
      add4(acc, make_uint2(line.x, line.z));
    }
    uint2 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
    h[0] = __floats2bfloat162_rn(acc[0], acc[1]);
    h[1] = __floats2bfloat162_rn(acc[2], acc[3]);
    out[i] = r;
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(p.ll_state + 1, 1ull) == gridDim.x - 1) {  // the last block: next call
    p.ll_state[1] = 0;
    p.ll_state[0] = call + 1;  // the next kernel on this stream starts after this one ends, and sees it
  }
}

// One thread per vector of `Vec` (up to max_blocks blocks, then the kernels stride).
template <typename Vec>
int launch(void (*kernel)(const P2PAllReduceParams*, const Vec*, Vec*, int64_t), const void* params,
           int max_blocks, const void* in, void* out, int64_t vecs, void* stream) {
  int64_t blocks = (vecs + kThreads - 1) / kThreads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  kernel<<<(int)blocks, kThreads, 0, (cudaStream_t)stream>>>(static_cast<const P2PAllReduceParams*>(params),
                                                              static_cast<const Vec*>(in), static_cast<Vec*>(out),
                                                              vecs);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" {

// x (n bf16, n % 8 == 0, n <= max_elems) all-reduced into out (may be x) on `stream`; capturable.
int blink_p2p_allreduce_bf16(const void* params, int max_blocks, const void* in, void* out, int64_t n,
                             void* stream) {
  return launch<uint4>(p2p_allreduce_kernel, params, max_blocks, in, out, n / 8, stream);
}

// The LL kernel: n % 4 == 0, n <= ll_max_elems, in and out 8-byte aligned (out may be in); capturable.
int blink_p2p_allreduce_ll_bf16(const void* params, int max_blocks, const void* in, void* out, int64_t n,
                                void* stream) {
  return launch<uint2>(p2p_allreduce_ll_kernel, params, max_blocks, in, out, n / 4, stream);
}

uint64_t blink_p2p_params_bytes() { return sizeof(P2PAllReduceParams); }

// Size, then each field's offset in declaration order: tests pin blink/parallel/p2p_allreduce.py to these.
void blink_p2p_params_layout(uint64_t* out) {
  using P = P2PAllReduceParams;
  const uint64_t layout[] = {sizeof(P),           offsetof(P, world),  offsetof(P, rank),
                             offsetof(P, max_elems), offsetof(P, max_blocks), offsetof(P, reserved),
                             offsetof(P, stage),  offsetof(P, flags),  offsetof(P, epochs),
                             offsetof(P, ll_max_elems), offsetof(P, lines), offsetof(P, ll_state)};
  for (uint64_t i = 0; i < sizeof(layout) / sizeof(layout[0]); ++i) out[i] = layout[i];
}

}  // extern "C"
