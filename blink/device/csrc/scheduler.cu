// Device mode's resident scheduler (Blink's pattern, shared/probes/chain.cu "(c)"): one CTA in its own
// device-launchable graph. Per step it polls the ingress ring, builds the step (sched.h), fire-and-forget
// launches the bucket's forward graph (two execs per bucket, one per buffer set, alternated), writes the last
// step's records and ingests new requests while it runs, spins on a completion counter that the graph's last
// kernel (step_done) bumps, then completes the step. Every
// `launches_per_kernel` launches it tail-relaunches itself to renew the fire-and-forget budget.
#include <cuda_runtime.h>

#include <cstring>

#include "follower.cuh"
#include "loop_step.cuh"

using namespace blink;

namespace {

constexpr int kThreads = 256;

// The last node of every forward graph: its outputs are written; tell the scheduler.
__global__ void step_done_kernel(uint32_t* counter) {
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
  }
}

__global__ void init_kernel(SchedState* s, SchedConfig c, uint64_t ingress_head, uint64_t arena_head,
                            uint64_t egress_tail) {
  if (threadIdx.x == 0 && blockIdx.x == 0) sched_init(s, c, ingress_head, arena_head, egress_tail);
}

// Relaunch-each-step mode: this instance was tail-launched after the previous one's forward finished.
__device__ void complete_pending(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (!load_volatile(&s->pending_complete)) return;
  if (t.leader()) trace_row(p, s->launched - 1)[1] = now_ns();
  sched_complete(t, p, false, true);
  if (t.leader()) s->pending_complete = 0;
  t.sync();
}

__global__ void __launch_bounds__(kThreads) scheduler_kernel(const LoopParams* params) {
  const LoopParams& p = *params;
  const Team t{(int)threadIdx.x, (int)blockDim.x, nullptr};
  SchedState* s = p.state;
  ControlBlock* ctl = p.rings.control;
  if (t.leader()) {
    s->launches_this_kernel = 0;
    if (s->idle_ns == 0) s->idle_ns = kIdleMinNs;
    store_volatile(&ctl->engine_mode, kEngineModeDevice);
    store_volatile(&ctl->ready, 1u);
  }
  t.sync();
  complete_pending(t, p);
  while (true) {
    if (p.cfg.decode_pace_us > 0 && s->launched > 0) pace_decodes(t, p, trace_row(p, s->launched - 1)[0]);
    if (t.leader()) {  // the stop flag as read during the last forward, else fresh (idle: no hurry)
      const bool stop = s->ingress_tail_valid ? s->stop_seen != 0 : load_volatile(&ctl->stop_flag) != 0;
      s->stopping = stop || s->error_code == kErrStepTimeout;
    }
    t.sync();
    if (load_volatile(&s->stopping)) break;
    if (sched_prepare(t, p) == 0) {
      flush_pending_records(t, p);
      if (t.leader()) idle_turn(p);  // publishes first
      t.sync();
      if (load_volatile(&s->stopping)) break;
      if (load_volatile(&s->parking)) {
        t.sync();  // every rank has read the flag before the leader clears it
        if (t.leader()) park_done(s);
        return;  // parked: no `exited`; the host relaunches this graph (blink/device/idle.py)
      }
      continue;
    }
    if (t.leader()) {
      s->idle_ns = kIdleMinNs;
      s->idle_since_ns = 0;
      launch_step(p, false);
    }
    t.sync();
    const bool gap_only = p.hooks != nullptr && p.hooks->ingest_between_forwards;  // the self-test's A/B
    bool mismatch = false;
    while (true) {  // the forward launched last runs; the next one may be launched ahead (sched_ahead.h)
      const bool running = load_volatile(&s->plan_rows) > 0;  // a failed launch leaves no rows
      work_during_forward(t, p, running && !gap_only);
      if (t.leader()) publish(s, p.cfg, p.rings);  // the last step's records and counters, while this forward runs
      const AheadPlan a = running && !mismatch ? prepare_ahead(t, p) : AheadPlan{};
      bool over = true;  // no output of this step to finish here: none ran, a timeout failed it, or a relaunch does
      if (running) {
        over = wait_step(t, p, !gap_only, a);
      } else {
        t.sync();
      }
      if (mismatch) {  // the same on every rank (finish_behind); its forward is done
        if (t.leader()) fail_planned_step(p, kErrAheadMismatch);
        t.sync();
        over = true;
      }
      if (over) break;
      if (take_ahead(t, p, a)) {
        bool launched = false;
        if (t.leader() && !(launched = launch_step(p, true, a.exec))) {  // a launch error: plan it again
          s->ahead_launches--;
          s->ahead_misses++;
        }
        if (t.sync_or(launched)) {
          mismatch = !finish_behind(t, p);
          continue;
        }
      }
      sched_complete(t, p, false, true);
      break;
    }
    const bool relaunch = load_volatile(&s->pending_complete) != 0;
    if (relaunch || load_volatile(&s->launches_this_kernel) >= p.cfg.launches_per_kernel) {
      flush_pending_records(t, p);  // the next instance starts with none
      if (t.leader()) {
        publish(s, p.cfg, p.rings);
        const cudaError_t err = cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
        if (err != cudaSuccess) {
          set_error(s, p.rings, kErrTailLaunchBase + (int32_t)err);
          publish(s, p.cfg, p.rings);
          post_to_peers(p, s->launched + 1, kPeerStop);
          store_release(&ctl->exited, 1u);
        }
      }
      return;
    }
  }
  flush_pending_records(t, p);
  if (t.leader()) {
    publish(s, p.cfg, p.rings);
    post_to_peers(p, s->launched + 1, kPeerStop);
    store_release(&ctl->exited, 1u);
  }
}

// One kernel node (one CTA of `threads`) taking a single pointer argument, instantiated for device
// launch (the kernel tail-relaunches its own graph) and uploaded.
cudaError_t single_kernel_graph(void* func, int threads, void* params, void* stream, void** exec) {
  cudaGraph_t graph;
  cudaError_t e = cudaGraphCreate(&graph, 0);
  if (e != cudaSuccess) return e;
  cudaKernelNodeParams kp = {};
  void* args[] = {&params};
  kp.func = func;
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(threads);
  kp.kernelParams = args;
  cudaGraphNode_t node;
  e = cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kp);
  if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags((cudaGraphExec_t*)exec, graph,
                                                          cudaGraphInstantiateFlagDeviceLaunch);
  if (e == cudaSuccess) e = cudaGraphUpload((cudaGraphExec_t)*exec, (cudaStream_t)stream);
  cudaGraphDestroy(graph);
  return e;
}

}  // namespace

extern "C" {

uint64_t blink_sched_state_bytes(const SchedConfig* c) { return sched_carve(nullptr, *c); }

int blink_sched_init_device(void* state, const SchedConfig* c, uint64_t ingress_head, uint64_t arena_head,
                            uint64_t egress_tail, void* stream) {
  init_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((SchedState*)state, *c, ingress_head, arena_head, egress_tail);
  return (int)cudaGetLastError();
}

// Called by the host inside each forward graph's capture, after sampling: the graph's last node.
int blink_capture_step_done(void* stream, void* counter) {
  step_done_kernel<<<1, 32, 0, (cudaStream_t)stream>>>((uint32_t*)counter);
  return (int)cudaGetLastError();
}

void* blink_done_counter(void* state) { return &static_cast<SchedState*>(state)->done_count; }

int blink_host_register(void* ptr, uint64_t bytes) {
  return (int)cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
}
int blink_host_unregister(void* ptr) { return (int)cudaHostUnregister(ptr); }
int blink_host_device_pointer(void* host, void** dev) { return (int)cudaHostGetDevicePointer(dev, host, 0); }

int blink_stream_create(void** stream) {
  return (int)cudaStreamCreateWithFlags((cudaStream_t*)stream, cudaStreamNonBlocking);
}
int blink_stream_query(void* stream) { return (int)cudaStreamQuery((cudaStream_t)stream); }
int blink_stream_synchronize(void* stream) { return (int)cudaStreamSynchronize((cudaStream_t)stream); }
int blink_stream_destroy(void* stream) { return (int)cudaStreamDestroy((cudaStream_t)stream); }

// A torch-captured graph (g.raw_cuda_graph()) instantiated for launch from the device, and uploaded.
int blink_instantiate_device(void* raw_graph, void* stream, void** exec) {
  cudaGraphInstantiateParams ip = {};
  ip.flags = cudaGraphInstantiateFlagDeviceLaunch;
  cudaError_t e = cudaGraphInstantiateWithParams((cudaGraphExec_t*)exec, (cudaGraph_t)raw_graph, &ip);
  if (e != cudaSuccess) return (int)e;
  return (int)cudaGraphUpload((cudaGraphExec_t)*exec, (cudaStream_t)stream);
}

// Node counts by cudaGraphNodeType (first 16 types), to explain a refused device-launch instantiation.
int blink_describe_graph(void* raw_graph, int* counts) {
  size_t n = 0;
  cudaError_t e = cudaGraphGetNodes((cudaGraph_t)raw_graph, nullptr, &n);
  if (e != cudaSuccess) return (int)e;
  cudaGraphNode_t* nodes = new cudaGraphNode_t[n];
  e = cudaGraphGetNodes((cudaGraph_t)raw_graph, nodes, &n);
  for (size_t i = 0; e == cudaSuccess && i < n; ++i) {
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(nodes[i], &type) == cudaSuccess && (int)type < 16) counts[(int)type]++;
  }
  delete[] nodes;
  return (int)e;
}

int blink_exec_destroy(void* exec) { return (int)cudaGraphExecDestroy((cudaGraphExec_t)exec); }

// The scheduler's own graph: one kernel node reading the LoopParams at `params` (device memory).
int blink_loop_create(void* params, void* stream, void** exec) {
  return (int)single_kernel_graph((void*)scheduler_kernel, kThreads, params, stream, exec);
}

// A follower rank's loop graph (follower.cuh), reading the FollowerParams at `params`.
int blink_follower_create(void* params, void* stream, void** exec) {
  return (int)single_kernel_graph((void*)follower_kernel, 32, params, stream, exec);
}

uint64_t blink_follower_state_bytes() { return sizeof(FollowerState); }
void* blink_follower_done_counter(void* state) { return &static_cast<FollowerState*>(state)->done_count; }

// Lets this process's current device read and write `peer`'s memory (already enabled counts as success).
int blink_enable_peer_access(int peer) {
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // clear it
    return 0;
  }
  return (int)e;
}

int blink_loop_launch(void* exec, void* stream) {
  return (int)cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
}

const char* blink_cuda_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

// Maps another process's cudaMalloc block (its 64-byte cudaIpcMemHandle_t) into this process for the
// current device: with lazy peer access, this device's kernels may then load and store it directly.
int blink_ipc_open(const void* handle, void** ptr) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof(h));
  return (int)cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
}
int blink_ipc_close(void* ptr) { return (int)cudaIpcCloseMemHandle(ptr); }

}  // extern "C"
