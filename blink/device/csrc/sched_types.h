// The scheduler's configuration, the device pointers it works on, and its own state (one buffer,
// carved by sched_carve). Config and pointer structs are mirrored in blink/device/structs.py;
// tests/device/test_structs.py compiles this header (g++, and nvcc for the device passes) and checks every
// field's name, offset, size and kind, each pointer's pointee, every sizeof and the shared constants.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform.h"

namespace blink {

constexpr int kMaxBuckets = 32;
constexpr int kMaxEos = 8;
constexpr int kMaxLogitBias = 300;  // blink.request.MAX_LOGIT_BIAS (the sampling state's row width)
constexpr int kIngestBatch = 64;    // descriptors staged per ingest round
// Per launch, %globaltimer ns unless noted: [0] launch call, [1] completion seen, [2] tokens << 32 | rows,
// [3] this step's finish done, [4] ingest done, [5] plan done, [6] inputs written, [7] launch call returned.
// The gap before launch L splits into finish (L-1: [3]-[1]), ingest (L[4] - L-1[3]), plan, inputs, launch.
constexpr int kTraceWords = 8;

constexpr int32_t kFlagPenalties = 1;  // sampling_state.FLAG_PENALTIES
constexpr int32_t kFlagLogitBias = 2;  // sampling_state.FLAG_LOGIT_BIAS

// error_code values (ControlBlock.error_code and SchedState.error_code)
constexpr int32_t kErrInvalidDescriptor = 1;
constexpr int32_t kErrStepTimeout = 2;
constexpr int32_t kErrNoBucket = 3;
constexpr int32_t kErrLaunchBase = 1000;      // + cudaError_t of a forward launch
constexpr int32_t kErrTailLaunchBase = 2000;  // + cudaError_t of the scheduler's own tail relaunch

struct SchedConfig {
  int32_t max_num_seqs;            // sampling slots 0..max_num_seqs-1; max_num_seqs is the scratch slot
  int32_t max_num_batched_tokens;  // token budget per step
  int32_t max_model_len;
  int32_t block_size;
  int32_t num_blocks;
  int32_t max_blocks_per_seq;  // row width of StepBuffers.block_tables
  int32_t max_requests;        // request table size (waiting + running)
  int32_t vocab_size;
  int32_t num_buckets;
  int32_t num_eos;
  int32_t trace_capacity;       // launches kept in the trace ring
  int32_t launches_per_kernel;  // fire-and-forget launches before the tail relaunch (<= 119)
  int32_t bucket_tokens[kMaxBuckets];
  int32_t bucket_seqs[kMaxBuckets];
  int32_t eos_ids[kMaxEos];
  int32_t relaunch_each_step;  // 1: pattern (a), F&F the forward then tail-relaunch (frees the SM meanwhile)
  int32_t fail_bucket;  // self-test only: launches of this bucket report a launch error (-1: none)
  int64_t step_timeout_ns;  // a forward that never signals is an error, not a hang
};

struct StepBufferPtrs {  // blink.core.step_buffers.StepBuffers, field order
  int64_t* input_ids;
  int64_t* positions;
  int64_t* slot_mapping;
  int32_t* query_start_loc;
  int32_t* seq_lens;
  int32_t* block_tables;
  int64_t* logits_indices;
  int32_t* sample_slots;
  int64_t* sample_positions;
  int64_t* sampled_ids;
  float* logprobs;
  int64_t* top_ids;
  float* top_logprobs;
};

struct SamplingPtrs {  // blink.kernels.sampling_state.SamplingState tensors
  float* temperature;
  float* top_p;
  int32_t* top_k;
  float* min_p;
  float* presence_penalty;
  float* frequency_penalty;
  float* repetition_penalty;
  int64_t* seed;
  int32_t* bias_ids;
  float* bias_vals;
  int32_t* output_counts;
  uint8_t* prompt_mask;
  int32_t* flags;
  int32_t* num_logprobs;  // the sampler computes top logprobs only for slots asking for them
};

struct RingPtrs {  // sections of the shared-memory segment (device pointer == host pointer)
  ControlBlock* control;
  RingHeader* ingress_header;
  RequestDescriptor* ingress;
  RingHeader* arena_header;
  int32_t* arena;
  RingHeader* egress_header;
  TokenRecord* egress;
  uint64_t ingress_capacity;
  uint64_t arena_capacity;
  uint64_t egress_capacity;
};

struct SchedState;

// Device-mode tensor parallelism: rank 0's scheduler writes every step's inputs into each other rank's
// buffers too (peer-mapped memory over NVLink), then posts (step sequence number << 32 | command) in
// that rank's mailbox, where its follower kernel (follower.cuh) polls. Command: a bucket index, or stop.
constexpr int kMaxPeers = 7;
constexpr uint32_t kPeerStop = 0xFFFFFFFFu;

struct PeerPtrs {
  StepBufferPtrs buffers[2];  // the rank's buffer sets, as mapped in rank 0's address space
  uint64_t* mailbox;
};

struct PeerTable {
  int32_t num_peers;
  int32_t reserved;
  PeerPtrs peers[kMaxPeers];
};

// A follower rank's loop (follower.cuh): its own state and what it reads.
struct FollowerState {
  uint32_t done_count;  // bumped by the last node (step_done) of every forward graph
  uint32_t exited;      // 1 once the loop ended (stop posted, or an error)
  uint64_t last_seq;    // the last step sequence number taken from the mailbox
  uint64_t launched;    // forward graphs launched
  int32_t launches_this_kernel;
  int32_t error_code;  // kErrLaunchBase + cudaError_t, kErrTailLaunchBase + ..., kErrStepTimeout, kErrNoBucket
  uint64_t heartbeat;  // polls while idle, for a host that wants to see the loop breathe
};

struct FollowerParams {
  uint64_t* mailbox;  // in this rank's memory, written by rank 0 over NVLink
  FollowerState* state;
  void* graph_execs;  // cudaGraphExec_t[num_buckets][2], the same layout as rank 0's
  int32_t num_buckets;
  int32_t launches_per_kernel;
  int64_t step_timeout_ns;
};

struct LoopParams {
  SchedConfig cfg;
  SchedState* state;
  RingPtrs rings;
  StepBufferPtrs buffers[2];  // one set per step parity (each bucket is captured once per set)
  SamplingPtrs sampling;
  void* graph_execs;  // cudaGraphExec_t[num_buckets][2]
  uint64_t* trace;    // [trace_capacity][kTraceWords]
  const PeerTable* peers;  // nullptr without tensor parallelism
};

enum RequestStatus : int32_t { kFree = 0, kWaiting = 1, kRunning = 2, kStaging = 3 };  // kStaging: being copied in

struct RequestEntry {
  RequestDescriptor desc;
  int32_t status;
  int32_t slot;           // sampling slot and block-table row while running, else -1
  int32_t num_generated;  // tokens sampled so far
  int32_t num_computed;   // tokens whose K/V are in the cache
  int32_t num_blocks;     // KV blocks held
  int32_t planned_row;    // row in the step being built, or -1
};

struct SchedState {
  uint32_t done_count;  // bumped by the step_done kernel at the end of every forward graph
  int32_t error_code;
  uint64_t launched;  // forward launches so far (parity = launched & 1)
  uint64_t steps, tokens, preemptions, heartbeat, fast_plans;  // fast_plans: plan_decodes_fast applied
  uint64_t ingress_head, arena_head, egress_tail;  // our own ring counters (we are their only writer)
  // Cached copies of the other side's counters: each fresh read is a PCIe round trip (~1-2 us).
  uint64_t egress_head_seen;    // the reader has consumed at least this far
  uint64_t ingress_tail_seen;   // read while the last forward ran; valid when ingress_tail_valid
  int32_t ingress_tail_valid, stop_seen;  // stop_flag, read with the tail (same validity)
  uint64_t t_finish, t_ingest, t_plan, t_inputs;  // phase stamps of the step being built (trace)
  int32_t free_block_top, free_slot_top, free_entry_top;
  int32_t waiting_head, waiting_count, running_count;
  int32_t stopping, launches_this_kernel, idle_ns, num_staged, num_consumed, pending_complete;
  int32_t plan_rows, plan_tokens, plan_bucket, num_jobs;
  int32_t fast_plan, not_decode, num_records, chunk;  // team scratch: plan fast path, egress chunking
  // arrays, carved from the same buffer
  RequestEntry* entries;  // [max_requests]
  int32_t* free_entries;  // [max_requests] stack
  int32_t* waiting;       // [max_requests] circular FCFS queue of entries
  int32_t* running;       // [max_num_seqs] entries in admission order (last = newest)
  int32_t* free_blocks;   // [num_blocks] stack
  int32_t* free_slots;    // [max_num_seqs] stack
  int32_t* block_tables;  // [max_num_seqs][max_blocks_per_seq], row = slot
  int32_t* token_store;   // [max_requests][max_model_len + 1] prompt then generated tokens
  int32_t* bias_ids;      // [max_requests][kMaxLogitBias]
  float* bias_vals;       // [max_requests][kMaxLogitBias]
  int32_t* row_entry;     // [max_num_seqs] the step being built: entry, first position, tokens
  int32_t* row_start;
  int32_t* row_len;
  int32_t* row_qstart;
  int32_t* job_entry;     // [max_num_seqs] admissions whose sampling slot must be written
  int32_t* order;         // [max_num_seqs] scratch: running entries in scheduling order
  RequestDescriptor* staged;  // [kIngestBatch] descriptors copied out of the ring
  int32_t* staged_entry;      // [kIngestBatch] entry taken for each, or -1
  int32_t* staged_bad;        // [kIngestBatch] a prompt token was out of range
  int32_t* row_need;          // [max_num_seqs] per running/step row: a new KV block, then its stack index
  int32_t* row_record;        // [max_num_seqs] the row's egress record index in this step, or -1
  int32_t* row_reason;        // [max_num_seqs] the row's finish reason
};

static_assert(offsetof(SchedState, launched) == 8, "runtime.py reads `launched` at structs.SCHED_STATE_LAUNCHED");

BLINK_HD inline int64_t token_stride(const SchedConfig& c) { return (int64_t)c.max_model_len + 1; }

// Carve the arrays out of the buffer that starts with the SchedState; returns the bytes needed.
// With state == nullptr it only measures.
BLINK_HD inline uint64_t sched_carve(SchedState* s, const SchedConfig& c) {
  uint64_t off = (sizeof(SchedState) + 255) & ~uint64_t(255);
  char* base = reinterpret_cast<char*>(s);
  auto take = [&](uint64_t bytes) -> void* {
    void* p = base ? base + off : nullptr;
    off += (bytes + 255) & ~uint64_t(255);
    return p;
  };
  const uint64_t R = c.max_requests, S = c.max_num_seqs, i4 = 4;
  void* p[22];
  p[0] = take(R * sizeof(RequestEntry));
  p[1] = take(R * i4);
  p[2] = take(R * i4);
  p[3] = take(S * i4);
  p[4] = take((uint64_t)c.num_blocks * i4);
  p[5] = take(S * i4);
  p[6] = take(S * c.max_blocks_per_seq * i4);
  p[7] = take(R * token_stride(c) * i4);
  p[8] = take(R * kMaxLogitBias * i4);
  p[9] = take(R * kMaxLogitBias * i4);
  for (int k = 10; k < 15; ++k) p[k] = take(S * i4);
  p[15] = take(kIngestBatch * sizeof(RequestDescriptor));
  p[16] = take(kIngestBatch * i4);
  p[17] = take(kIngestBatch * i4);
  p[18] = take(S * i4);
  for (int k = 19; k < 22; ++k) p[k] = take(S * i4);
  if (s) {
    s->entries = (RequestEntry*)p[0];
    s->free_entries = (int32_t*)p[1];
    s->waiting = (int32_t*)p[2];
    s->running = (int32_t*)p[3];
    s->free_blocks = (int32_t*)p[4];
    s->free_slots = (int32_t*)p[5];
    s->block_tables = (int32_t*)p[6];
    s->token_store = (int32_t*)p[7];
    s->bias_ids = (int32_t*)p[8];
    s->bias_vals = (float*)p[9];
    s->row_entry = (int32_t*)p[10];
    s->row_start = (int32_t*)p[11];
    s->row_len = (int32_t*)p[12];
    s->row_qstart = (int32_t*)p[13];
    s->job_entry = (int32_t*)p[14];
    s->staged = (RequestDescriptor*)p[15];
    s->staged_entry = (int32_t*)p[16];
    s->staged_bad = (int32_t*)p[17];
    s->order = (int32_t*)p[18];
    s->row_need = (int32_t*)p[19];
    s->row_record = (int32_t*)p[20];
    s->row_reason = (int32_t*)p[21];
  }
  return off;
}

// Fresh state: every block, slot and entry free, empty queues. Stacks pop the lowest id first.
BLINK_HD inline void sched_init(SchedState* s, const SchedConfig& c, uint64_t ingress_head,
                                uint64_t arena_head, uint64_t egress_tail) {
  char* raw = reinterpret_cast<char*>(s);
  for (uint64_t i = 0; i < sizeof(SchedState); ++i) raw[i] = 0;
  sched_carve(s, c);
  s->ingress_head = ingress_head;
  s->arena_head = arena_head;
  s->egress_tail = egress_tail;
  for (int i = 0; i < c.num_blocks; ++i) s->free_blocks[i] = c.num_blocks - 1 - i;
  s->free_block_top = c.num_blocks;
  for (int i = 0; i < c.max_num_seqs; ++i) s->free_slots[i] = c.max_num_seqs - 1 - i;
  s->free_slot_top = c.max_num_seqs;
  for (int i = 0; i < c.max_requests; ++i) {
    s->free_entries[i] = c.max_requests - 1 - i;
    s->entries[i].status = kFree;
    s->entries[i].slot = -1;
    s->entries[i].planned_row = -1;
  }
  s->free_entry_top = c.max_requests;
}

}  // namespace blink
