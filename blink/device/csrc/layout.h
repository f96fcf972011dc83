// C++ / CUDA mirror of blink/transport/layout.py, the one definition of the shared-memory layout.
// tests/transport/test_layout_header.py compiles this header and checks every field's offset, size and
// kind, every constant and the section offsets against the Python side: change both together.
//
// Ring protocol (single producer / single consumer, 64-bit counters that only grow, slot = c % capacity):
//   producer: write the payload, then publish `tail` with a release store (st.release.sys on the GPU);
//   consumer: load `tail` with an acquire load (ld.acquire.sys; a plain load may be hoisted and spin
//   forever), copy the payload out, then publish `head` with a release store. No read-modify-write
//   atomics on these words: they are not atomic across PCIe.
// Ingress arena: a request's prompt (prompt_len int32 tokens), then num_logit_bias token ids, then
// num_logit_bias float32 biases (as int32 bits) sit at arena counters [arena_offset, arena_offset +
// arena_len), wrapping at arena_capacity. Requests fill the arena in ring order, so after copying a
// request out the consumer sets the arena head to arena_offset + arena_len.
// Grammar staging (after egress): kGrammarSlots slots of grammar_slot_words int32 each; a slot holds one
// compiled constraint, token -> class [vocab] then next local state [states][classes] (-1: disallowed),
// written by the front end only while no request in flight uses the slot (blink/transport/grammar_staging.py).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define BLINK_HD __host__ __device__
#else
#define BLINK_HD
#endif

namespace blink {

constexpr uint64_t kMagic = 0x4B4E494C42ull;  // "BLINK"
constexpr uint32_t kVersion = 5;  // 2: the control block publishes the engine's limits; 3: prefix caching;
                                  // 4: grammar staging; 5: busy step intervals
constexpr int kMaxPublishedBuckets = 16;
constexpr uint64_t kCacheLine = 64;
constexpr uint64_t kPage = 4096;
constexpr int kMaxStopIds = 16;
constexpr int kMaxTopLogprobs = 20;

constexpr uint32_t kKindRequest = 1;
constexpr uint32_t kKindAbort = 2;
constexpr uint32_t kFlagIgnoreEos = 1;
constexpr uint32_t kFlagConstraint = 2;  // structured output: its tables are in descriptor.grammar_slot
// Structured outputs in device mode: one grammar staging slot per grammar arena partition.
constexpr int kGrammarSlots = 16;
constexpr uint32_t kPromptLogprobsMask = 0xFFu << 8;  // prompt logprobs: N + 1 (0 = none), layout.py

constexpr uint32_t kEngineModeNone = 0;
constexpr uint32_t kEngineModeHost = 1;
constexpr uint32_t kEngineModeDevice = 2;
// The ControlBlock.iteration_tokens bucket of a step of `tokens` tokens: bounds 1, 8, 32, 128, 512, 2048
// (layout.py's ITERATION_TOKEN_BOUNDS), then one unbounded bucket.
BLINK_HD inline int iteration_bucket(int tokens) {
  return tokens <= 1 ? 0 : tokens <= 8 ? 1 : tokens <= 32 ? 2 : tokens <= 128 ? 3 : tokens <= 512 ? 4
       : tokens <= 2048 ? 5 : 6;
}

// The ControlBlock.step_intervals bucket of a busy step interval of `ns`: bounds 5, 10, 25, 50, 100, 250 ms
// (layout.py's STEP_INTERVAL_BOUNDS_NS), then one unbounded bucket.
BLINK_HD inline int step_interval_bucket(uint64_t ns) {
  constexpr uint64_t ms = 1000000ull;
  return ns <= 5 * ms ? 0 : ns <= 10 * ms ? 1 : ns <= 25 * ms ? 2 : ns <= 50 * ms ? 3 : ns <= 100 * ms ? 4
       : ns <= 250 * ms ? 5 : 6;
}

// Finish reasons, as blink.request.FinishReason.
constexpr uint32_t kFinishNone = 0;
constexpr uint32_t kFinishStop = 1;
constexpr uint32_t kFinishLength = 2;
constexpr uint32_t kFinishAbort = 3;
constexpr uint32_t kFinishError = 4;

// Engine status and host->engine commands. Written by the engine unless noted.
struct ControlBlock {
  uint64_t magic;
  uint32_t version;
  uint32_t engine_mode;  // 0 = not attached, 1 = host, 2 = device
  uint64_t ingress_capacity;  // sizes, written by the creator (front end)
  uint64_t arena_capacity;
  uint64_t egress_capacity;
  // grammar staging (structured outputs in device mode), written by the creator: slots, int32 words each
  uint32_t grammar_slots;
  uint32_t grammar_slot_words;
  uint8_t _pad0[16];
  // line 1: commands from the host / front end
  uint32_t stop_flag;  // set to 1 by the parent: finish the step and exit
  uint32_t drain_flag;  // set to 1 by the parent: the front end takes no new requests
  uint32_t ingress_closed;  // set to 1 by the front end after its last descriptor: once all it sent is
                            // served, the engine exits on its own (the drain is over)
  uint32_t reset_prefix_cache;  // bumped by the front end: forget the cached KV blocks once
  uint8_t _pad1[48];
  // line 2: live counters from the engine (for /metrics and /health)
  uint32_t ready;  // 1 once the engine serves the rings
  uint32_t running;
  uint32_t waiting;
  uint32_t free_kv_blocks;
  uint32_t total_kv_blocks;
  int32_t error_code;  // last engine-side error (0 = none), e.g. a device launch error
  uint64_t heartbeat;  // bumped by the engine loop, also when idle
  uint64_t steps;
  uint64_t tokens;  // generated tokens
  uint64_t preemptions;
  uint32_t exited;  // 1 once the engine loop has returned
  uint8_t _pad2[4];
  // lines 3-4: the engine's limits (blink/core/limits.py), written before `ready`, read by the front end
  uint32_t max_model_len;
  uint32_t max_num_seqs;
  uint32_t max_num_batched_tokens;
  uint32_t block_size;
  uint32_t num_kv_blocks;
  uint32_t vocab_size;
  uint32_t num_buckets;  // captured graph buckets: their token counts follow
  uint32_t dtype;  // for the start-up banner: an index into layout.py's DTYPE_NAMES
  uint32_t graphs_captured;  // 1 when the buckets are CUDA graphs, 0 when the model runs eagerly
  // prompt logprobs: rows per step (0 = the engine refuses prompt logprobs)
  uint32_t prompt_logprob_rows;
  uint8_t _pad3[24];
  uint32_t bucket_tokens[kMaxPublishedBuckets];
  // line 5: tokens per engine step (vLLM's iteration_tokens_total): a count per bucket of iteration_bucket()
  // (tokens <= bound, the last one unbounded) and their sum; written once per step
  uint64_t iteration_tokens[7];
  uint64_t iteration_tokens_sum;
  // line 6: prefix caching (blink/core/prefix_cache.py), from the engine
  uint64_t prefix_cache_queries;  // prompt tokens looked up at admissions
  uint64_t prefix_cache_hits;     // of those, found cached
  uint32_t prefix_cache_resets;   // reset_prefix_cache commands applied (equal: the last is done)
  uint32_t prefix_caching;        // 1 when the engine caches prefixes, written before `ready`
  uint8_t _pad4[40];
  // line 7: busy step intervals, from one step's completion to the next one's with no idle turn between (the
  // floor under every decoding stream's inter-token gap; a stall of the engine shows here, one of the front
  // end does not): a count per step_interval_bucket and their sum in ns; written once per step
  uint64_t step_intervals[7];
  uint64_t step_intervals_sum_ns;
};

// Head and tail on their own cache lines so producer and consumer never share one.
struct RingHeader {
  uint64_t tail;  // producer-owned
  uint8_t _pad0[56];
  uint64_t head;  // consumer-owned
  uint8_t _pad1[56];
};

// One ingress record: a new request (kKindRequest) or an abort (kKindAbort, only req_id used).
struct RequestDescriptor {
  uint32_t kind;
  uint32_t num_stop_ids;
  uint64_t req_id;
  uint64_t arena_offset;  // arena counter of the first prompt token
  uint32_t prompt_len;
  uint32_t num_logit_bias;
  uint32_t arena_len;  // prompt_len + 2 * num_logit_bias
  uint32_t max_tokens;
  uint32_t min_tokens;
  uint32_t flags;  // kFlagIgnoreEos
  float temperature;  // 0 = greedy
  float top_p;
  int32_t top_k;  // 0 = off
  float min_p;
  float presence_penalty;
  float frequency_penalty;
  float repetition_penalty;
  int32_t num_logprobs;  // -1 = no logprobs, 0 = chosen token only, k = top-k too
  uint64_t seed;  // always set: the front end picks a random one when the client gave none
  int32_t stop_token_ids[kMaxStopIds];
  // structured outputs in device mode (grammar staging): the slot holding the tables (-1: none), their
  // state and class counts, and the slot's write generation (copied when it differs from the loaded one)
  int32_t grammar_slot;
  int32_t grammar_states;
  int32_t grammar_classes;
  uint32_t grammar_gen;
};

// One egress record: a generated token, or the end of a request (finish_reason != 0).
// A request's last record carries its finish reason; for abort/error with no new token, token_id = -1.
struct TokenRecord {
  uint64_t req_id;
  int32_t token_id;
  int32_t position;  // index of this output token: 0, 1, 2, ...
  uint16_t finish_reason;
  uint16_t num_top;
  uint32_t cached_tokens;  // prompt tokens the request found in the prefix cache
  float logprob;
  uint32_t queue_us;  // a request's first record only: us from engine ingest to first admission
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

static_assert(sizeof(ControlBlock) == 512, "ControlBlock must match layout.py");
static_assert(offsetof(ControlBlock, step_intervals) == 448, "step intervals start cache line 7");
static_assert(offsetof(ControlBlock, prefix_cache_queries) == 384, "prefix-cache counters start cache line 6");
static_assert(offsetof(ControlBlock, max_model_len) == 192, "limits start cache line 3");
static_assert(offsetof(ControlBlock, stop_flag) == 64, "stop_flag starts cache line 1");
static_assert(offsetof(ControlBlock, ready) == 128, "engine counters start cache line 2");
static_assert(sizeof(RingHeader) == 128, "RingHeader must match layout.py");
static_assert(offsetof(RingHeader, head) == kCacheLine, "head and tail on separate cache lines");
static_assert(sizeof(RequestDescriptor) == 168, "RequestDescriptor must match layout.py");
static_assert(offsetof(RequestDescriptor, seed) == 80, "RequestDescriptor must match layout.py");
static_assert(sizeof(TokenRecord) == 192, "TokenRecord must match layout.py");
static_assert(offsetof(TokenRecord, top_logprobs) == 112, "TokenRecord must match layout.py");

BLINK_HD constexpr uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// Byte offsets of each section inside the segment (SegmentLayout in layout.py).
struct SegmentLayout {
  uint64_t ingress_capacity;
  uint64_t arena_capacity;
  uint64_t egress_capacity;
  uint64_t grammar_slots = 0;       // grammar staging: 0 (no section) or kGrammarSlots
  uint64_t grammar_slot_words = 0;  // int32 words per slot

  BLINK_HD constexpr uint64_t control() const { return 0; }
  BLINK_HD constexpr uint64_t ingress_header() const { return kPage; }
  BLINK_HD constexpr uint64_t ingress_records() const { return ingress_header() + sizeof(RingHeader); }
  BLINK_HD constexpr uint64_t arena_header() const {
    return align_up(ingress_records() + ingress_capacity * sizeof(RequestDescriptor), kPage);
  }
  BLINK_HD constexpr uint64_t arena_data() const { return arena_header() + sizeof(RingHeader); }
  BLINK_HD constexpr uint64_t egress_header() const {
    return align_up(arena_data() + arena_capacity * sizeof(int32_t), kPage);
  }
  BLINK_HD constexpr uint64_t egress_records() const { return egress_header() + sizeof(RingHeader); }
  BLINK_HD constexpr uint64_t grammar_staging() const {
    return align_up(egress_records() + egress_capacity * sizeof(TokenRecord), kPage);
  }
  BLINK_HD constexpr uint64_t size() const {
    return align_up(grammar_staging() + grammar_slots * grammar_slot_words * sizeof(int32_t), kPage);
  }
};

}  // namespace blink
