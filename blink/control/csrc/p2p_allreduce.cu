// One-shot all-reduce (sum) of bf16 over the tensor-parallel ranks of one host, through peer memory:
// the alternative to NCCL's all-reduce for decode-sized tensors (issue 7: measure both). Every rank's
// arena (blink/parallel/p2p_allreduce.py) holds, in its own GPU memory:
//   stage[2][world][max_elems] bf16   peers push their inputs here (slot = their rank), two parities
//   flags[2][max_blocks][world] u32   peer r sets flags[par][b][r] = epoch once block b's chunk is pushed
//   epochs[max_blocks] u32            this rank's call count per block (never shared)
// A call, block b: push this rank's chunk b into every peer's stage slot, fence at system scope, raise
// our flag in every peer, wait for every peer's flag in our memory, then sum the chunk in rank order
// (the same bits on every rank). Parity = epoch & 1: a peer reaches call e+2 (which reuses parity e & 1)
// only after our flag of call e+1, which we raise after we finished reading call e.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kMaxWorld = 8;
constexpr int kThreads = 512;

struct P2PAllReduceParams {
  int32_t world;
  int32_t rank;
  int64_t max_elems;  // per slot
  int32_t max_blocks;
  int32_t reserved;
  __nv_bfloat16* stage[kMaxWorld];  // each rank's stage base, as mapped in this process (ours included)
  uint32_t* flags[kMaxWorld];       // each rank's flags base, likewise
  uint32_t* epochs;                 // ours
};

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void add8(float* acc, uint4 v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    acc[2 * k] += f.x;
    acc[2 * k + 1] += f.y;
  }
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

}  // namespace

extern "C" {

// x (n bf16, n % 8 == 0, n <= max_elems) all-reduced into out (may be x) on `stream`; capturable.
int blink_p2p_allreduce_bf16(const void* params, int max_blocks, const void* in, void* out, int64_t n,
                             void* stream) {
  const int64_t vecs = n / 8;
  int64_t blocks = (vecs + kThreads - 1) / kThreads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  p2p_allreduce_kernel<<<(int)blocks, kThreads, 0, (cudaStream_t)stream>>>(
      static_cast<const P2PAllReduceParams*>(params), static_cast<const uint4*>(in), static_cast<uint4*>(out),
      vecs);
  return (int)cudaGetLastError();
}

uint64_t blink_p2p_params_bytes() { return sizeof(P2PAllReduceParams); }

}  // extern "C"
