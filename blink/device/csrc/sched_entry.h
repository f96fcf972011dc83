// A request's row in the scheduler's request table, a token record waiting to be written, a row's check ahead: the
// per-request parts of SchedState (sched_types.h). Not mirrored in Python: only the scheduler reads them.
#pragma once

#include <cstdint>

#include "platform.h"

namespace blink {

enum RequestStatus : int32_t { kFree = 0, kWaiting = 1, kRunning = 2, kStaging = 3 };  // kStaging: being copied in

struct RequestEntry {
  RequestDescriptor desc;
  int32_t status;
  int32_t slot;           // sampling slot and block-table row while running, else -1
  int32_t num_generated;  // tokens sampled so far
  int32_t num_computed;   // tokens whose K/V are in the cache
  int32_t num_blocks;     // KV blocks held
  int32_t planned_row;    // row in the step being built, or -1
  uint32_t queue_us;      // ingest -> first admission, in us (the first egress record carries it)
  uint32_t admitted;      // admitted at least once (queue_us is final)
  uint64_t arrived_ns;    // now_ns() at ingest
  // Prefix caching (sched_prefix.h): blocks indexed or matched so far, the first admission's hit in
  // tokens (-1: not admitted yet), the (block, gen) its next block records as parent, its last key.
  int32_t num_hashed;
  int32_t num_cached_tokens;
  int32_t chain_parent;
  uint32_t chain_parent_gen;
  uint64_t chain_hash;
};

// A token record whose write waits until the next forward is launched (sched_records.h): what it needs of its
// request entry, copied at the finish because the next step's ingest may reuse the entry; its token, logprob and
// tops stay in the step's buffer set (pending_parity), which the next forward does not write.
struct PendingRecord {
  uint64_t req_id;
  int32_t position, cached_tokens;
  uint32_t reason_top;  // finish reason | num_top << 16
  uint32_t queue_us;
  int32_t row, pad;
};

// A row of a step launched ahead, its stop check gathered while the forward runs (sched_ahead.h): once the token is
// in, the check reads these 32 bytes beside it instead of walking the request entry (dependent round trips).
constexpr int kAheadIds = 7;
struct alignas(16) AheadRow {
  int32_t count;  // ids that stop the row at its next token (0: none, min_tokens not reached); -1: more than fit
  int32_t ids[kAheadIds];
};

}  // namespace blink
