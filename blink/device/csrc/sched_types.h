// The scheduler's configuration, the device pointers it works on, and its own state (one buffer,
// carved by sched_carve). Config and pointer structs are mirrored in blink/device/structs.py;
// tests/device/test_structs.py compiles this header (g++, and nvcc for the device passes) and checks every
// field's name, offset, size and kind, each pointer's pointee, every sizeof and the shared constants.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform.h"
#include "sched_entry.h"

namespace blink {

constexpr int kMaxBuckets = 32;
constexpr int kMaxEos = 8;
constexpr int kMaxLogitBias = 300;  // blink.request.MAX_LOGIT_BIAS (the sampling state's row width)
constexpr int kIngestBatch = 64;    // descriptors staged per ingest round
// Per launch, %globaltimer ns unless noted: [0] launch call, [1] completion seen, [2] tokens << 32 | rows,
// [3] this step's finish done, [4] ingest done, [5] plan done, [6] inputs written, [7] launch call returned,
// [8] this step's rows advanced and [9] frees done (inside its finish), [10] scheduled (inside the plan), [11] 1 if
// launched ahead (sched_ahead.h: then [10] stamps its rows checked, and [4], [5], [6] the end of its check), else 0.
// The gap before launch L splits into finish (L-1: [3]-[1]), ingest (L[4] - L-1[3]), plan, inputs, launch.
constexpr int kTraceWords = 12;
constexpr int kMatchAhead = 8;  // waiting requests whose prefix hits the team finds at once (sched_prefix.h)

constexpr int32_t kFlagPenalties = 1;  // sampling_state.FLAG_PENALTIES
constexpr int32_t kFlagLogitBias = 2;  // sampling_state.FLAG_LOGIT_BIAS
constexpr int32_t kFlagGrammar = 4;    // sampling_state.FLAG_GRAMMAR

// error_code values (ControlBlock.error_code and SchedState.error_code)
constexpr int32_t kErrInvalidDescriptor = 1;
constexpr int32_t kErrStepTimeout = 2;
constexpr int32_t kErrNoBucket = 3;
constexpr int32_t kErrAheadMismatch = 4;  // a step launched ahead was not the step the plan then made (a bug)
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
  int64_t step_timeout_ns;  // a forward that never signals is an error, not a hang
  int32_t enable_prefix_caching;  // share cached prompt prefixes' KV blocks (sched_prefix.h)
  int32_t prompt_logprob_rows;  // prompt logprobs: rows per step (StepBuffers.prompt_*), 0 = refused
  // Structured outputs (sched_grammar.h): the grammar arena's geometry (blink/grammar/arena.py), 0 slots = none
  int32_t grammar_slots;
  int32_t grammar_states_per_slot;
  int32_t grammar_cells_per_slot;
  int32_t grammar_reserved;
  // Issue 19, idle energy (scheduler.cu; blink/device/idle.py): the idle backoff doubles up to idle_max_ns,
  // and up to idle_deep_max_ns once idle for idle_deep_after_ns; after idle_park_after_ns (0: never) the
  // loop parks: it exits without `exited`, and the host relaunches it when work or a command arrives.
  int32_t idle_max_ns;
  int32_t idle_deep_max_ns;  // <= 1 ms (__nanosleep's longest)
  int64_t idle_deep_after_ns;
  int64_t idle_park_after_ns;
  int32_t sampler_variants;  // graphs per bucket: 1, or 2 with the searchless one (sched_variant.h)
  int32_t decode_pace_us;    // issue 19, energy: a decodes-only step starts this long after the last (sched_pace.h)
  int32_t decode_pace_max_batch;  // the pace holds only batches of at most this many running requests; 0 = any
  int32_t _pad0;                  // the struct's 8-byte alignment, explicit
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
  // prompt logprobs: [prompt_logprob_rows] (the last two [.][kMaxTopLogprobs])
  int64_t* prompt_rows;
  int64_t* prompt_targets;
  int32_t* prompt_num_top;
  float* prompt_logprob;
  int32_t* prompt_rank;
  int64_t* prompt_top_ids;
  float* prompt_top_logprobs;
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
  // structured outputs: each slot's automaton state and grammar, then the arena (sampling_state.py)
  int32_t* grammar_state;
  int32_t* grammar_id;
  int32_t* grammar_classes;
  int32_t* grammar_row_base;
  int32_t* grammar_cells;
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
  // structured outputs in device mode: the grammar staging section (nullptr: none), int32 words per slot
  const int32_t* grammar_staging;
  uint64_t grammar_slot_words;
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
  void* graph_execs;  // cudaGraphExec_t[num_buckets][2]: rank 0's first variant only (followers do not sample)
  int32_t num_buckets;
  int32_t launches_per_kernel;
  int64_t step_timeout_ns;
};

// The self-test's variants of the loop, kept out of the production config: LoopParams.hooks is nullptr
// in production (tools/device_selftest/ asks for them through DeviceLoop).
struct LoopHooks {
  int32_t relaunch_each_step;  // 1: pattern (a), F&F the forward then tail-relaunch (frees the SM meanwhile)
  int32_t fail_bucket;         // launches of this bucket report a launch error (-1: none)
  int32_t ingest_between_forwards;  // 1: no ingest while a forward runs (the loop before issue 17's change)
  int32_t no_launch_ahead;          // 1: every step is planned after the last one finished (sched_ahead.h)
  int32_t no_warm_ahead;            // 1: the wait loop does not keep the check's lines in L2 (warm_ahead)
  int32_t reserved;
};

struct LoopParams {
  SchedConfig cfg;
  SchedState* state;
  RingPtrs rings;
  StepBufferPtrs buffers[2];  // one set per step parity (each bucket is captured once per set)
  SamplingPtrs sampling;
  void* graph_execs;  // cudaGraphExec_t[sampler_variants][num_buckets][2] (sched_variant.h)
  uint64_t* trace;    // [trace_capacity][kTraceWords]
  const PeerTable* peers;  // nullptr without tensor parallelism
  const LoopHooks* hooks;  // nullptr in production
};

struct SchedState {
  uint32_t done_count;  // bumped by the step_done kernel at the end of every forward graph
  int32_t error_code;
  uint64_t launched;  // forward launches so far (parity = launched & 1)
  uint64_t steps, tokens, preemptions, heartbeat, fast_plans;  // fast_plans: plan_decodes_fast applied
  uint64_t iteration_tokens[7], iteration_tokens_sum;  // the steps' sizes (ControlBlock line 4)
  uint64_t step_intervals[7], step_intervals_sum_ns;  // busy step intervals (ControlBlock line 7)
  uint64_t busy_since_ns;  // the last step's finish; 0 after a plan with no rows (the next interval is not busy)
  uint64_t ingress_head, arena_head, egress_tail;  // our own ring counters (we are their only writer)
  // Cached copies of the other side's counters: each fresh read is a PCIe round trip (~1-2 us).
  uint64_t egress_head_seen;    // the reader has consumed at least this far
  uint64_t ingress_tail_seen;   // read while the last forward ran; valid when ingress_tail_valid
  int32_t ingress_tail_valid, stop_seen;  // stop_flag, read with the tail (same validity)
  uint64_t t_finish, t_ingest, t_plan, t_inputs;  // phase stamps of the step being built (trace)
  uint64_t t_rows, t_frees, t_scheduled;  // inside the finish (rows advanced, frees done) and the plan (scheduled)
  int32_t free_block_top, free_slot_top, free_entry_top;
  int32_t waiting_head, waiting_count, running_count;
  int32_t stopping, launches_this_kernel, idle_ns, num_staged, num_consumed, pending_complete;
  int32_t plan_rows, plan_tokens, plan_bucket, num_jobs;
  int32_t fast_plan, not_decode, num_records, chunk;  // team scratch: plan fast path, egress chunking
  int32_t plan_prompt_rows, reserved_prompt;  // prompt logprobs: rows the step being built uses
  int32_t plan_searchless;  // its graph leaves the sampler's search out (sched_variant.h)
  // Prefix caching: the evictable LRU (cached blocks nobody holds; a list through lru_prev/lru_next,
  // oldest at the head), the hash table's mask, counters, and reset commands seen / applied.
  int32_t lru_head, lru_tail, lru_count, hash_mask;
  uint64_t prefix_queries, prefix_hits;  // prompt tokens looked up at admissions / found cached
  uint32_t resets_seen, resets_done;  // ControlBlock.reset_prefix_cache, as prefetched / as applied
  // Structured outputs (sched_grammar.h): the staging generation each arena partition holds (0: none), and
  // this step's copies (at most one per partition)
  uint32_t grammar_loaded_gen[kGrammarSlots];
  int32_t grammar_copy_entry[kGrammarSlots];
  int32_t num_grammar_copies, grammar_pad;
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
  // per KV block: holders, allocations so far (its life), indexed?, LRU links, key, parent, tokens
  int32_t* block_ref;         // [num_blocks]
  uint32_t* block_gen;        // [num_blocks]
  int32_t* block_cached;      // [num_blocks]
  int32_t* lru_prev;          // [num_blocks]
  int32_t* lru_next;          // [num_blocks]
  uint64_t* block_key;        // [num_blocks]
  int32_t* block_parent;      // [num_blocks]
  uint32_t* block_parent_gen; // [num_blocks]
  int32_t* block_tokens;      // [num_blocks][block_size]
  int32_t* hash_table;        // [hash_mask + 1] open addressing (linear probing): a block, or -1
  int32_t* match_blocks;      // [max_blocks_per_seq] scratch: the admission's prefix hit
  int32_t* row_register;      // [max_num_seqs] the row filled blocks the leader must index
  // Issue 16, the prefix match off the leader (sched_prefix.h): the team's hits for the first waiting
  // requests (chain states, blocks found, hit lengths, LRU counts), valid while `evictions` is unchanged;
  // after a step, the rows that filled blocks (listed in any order, counted: none = no leader scan).
  int32_t plan_budget, ahead_count, num_filled, num_register;  // filled: rows listed; register: rows to index
  uint64_t evictions, ahead_evictions;  // LRU evictions so far (each erases an index entry) / at the match
  uint64_t team_matches, team_shares;   // admissions that took the team's match / left it the shares
  // Issue 19: when the current idle period began (0: not idle), and how often the loop parked.
  uint64_t idle_since_ns, parks;
  int32_t parking, reserved_idle;
  // The control gap (issue 17): the last step's records wait for the next launch (pending), and requests that
  // arrive during a forward are ingested then (ingest_in_flight); an abort waits for the gap, and for the
  // pending records of its request to be written first (abort_held).
  int32_t pending_count, pending_parity, ingest_in_flight, abort_held;
  // Launching ahead (sched_ahead.h): the next step's inputs, written while this forward runs (ahead_ready), are
  // launched once its tokens are in if nothing else changed; the team's decisions travel in Team::sync_or.
  // Steps launched ahead, and inputs written ahead but not taken.
  int32_t ahead_ready, ahead_rows, ahead_bucket, ahead_searchless;  // rows, bucket, variant: as written
  uint64_t ahead_launches, ahead_misses;
  int32_t ahead_len[kMatchAhead], ahead_in_lru[kMatchAhead];
  int32_t num_shares, share_entry[kMatchAhead], share_ahead[kMatchAhead], share_len[kMatchAhead];  // deferred
  uint64_t* ahead_state;   // [kMatchAhead][max_blocks_per_seq]
  int32_t* ahead_blocks;   // [kMatchAhead][max_blocks_per_seq] the indexed block with the same tokens, or -1
  int32_t* filled_rows;    // [max_num_seqs]
  PendingRecord* pending;  // [max_num_seqs] by record index
  AheadRow* ahead_check;   // [max_num_seqs] the rows written ahead: their stop checks
};

static_assert(offsetof(SchedState, launched) == 8, "runtime.py reads `launched` at structs.SCHED_STATE_LAUNCHED");

}  // namespace blink
