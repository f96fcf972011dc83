// The scheduler logic built for the host (g++) and driven through ctypes by tests/device: the test
// plays the forward pass (it reads the step inputs and writes sampled ids) between prepare and complete.
#include <thread>
#include <vector>

#include "sched_ahead.h"
#include "sched_idle.h"
#include "sched_pace.h"

using namespace blink;

namespace {

// Every KV block is held by as many running requests as its count says, and one nobody holds is on
// the stack or, if cached, in the LRU (once); the index holds exactly the cached blocks; likewise
// slots; queues and statuses agree. Returns 0, or a code saying which invariant broke.
int check_invariants(const SchedState* s, const SchedConfig& c) {
  static int owner[1 << 20], freed[1 << 20];
  if (c.num_blocks > (1 << 20)) return 99;
  for (int b = 0; b < c.num_blocks; ++b) owner[b] = freed[b] = 0;
  for (int i = 0; i < s->free_block_top; ++i) freed[s->free_blocks[i]]++;
  int lru = 0;
  for (int b = s->lru_head; b >= 0 && lru <= c.num_blocks; b = s->lru_next[b], ++lru) {
    if (!s->block_cached[b]) return 10;
    freed[b]++;
  }
  if (lru != s->lru_count) return 11;
  int slot_seen[4096] = {0};
  for (int i = 0; i < s->free_slot_top; ++i) slot_seen[s->free_slots[i]]++;
  int running = 0, waiting = 0, staged = 0;
  for (int e = 0; e < c.max_requests; ++e) {
    const RequestEntry& r = s->entries[e];
    if (r.status == kRunning) {
      ++running;
      if (r.slot < 0) return 3;
      slot_seen[r.slot]++;
      const int32_t* table = s->block_tables + (int64_t)r.slot * c.max_blocks_per_seq;
      for (int j = 0; j < r.num_blocks; ++j) owner[table[j]]++;
      if (r.num_computed > r.num_blocks * c.block_size) return 4;
    } else if (r.status == kWaiting) {
      ++waiting;
      if (r.slot != -1 || r.num_blocks != 0) return 5;
    } else if (r.status == kStaging) {
      ++staged;
    }
  }
  int cached = 0, indexed = 0;
  for (int b = 0; b < c.num_blocks; ++b) {
    if (owner[b] != s->block_ref[b] || freed[b] != (owner[b] == 0)) return 1;
    if (s->block_cached[b] && (++cached, table_find(s, s->block_key[b]) != b)) return 12;
  }
  for (int i = 0; i <= s->hash_mask; ++i) indexed += s->hash_table[i] >= 0;
  if (indexed != cached) return 13;
  for (int i = 0; i < c.max_num_seqs; ++i)
    if (slot_seen[i] != 1) return 2;
  if (running != s->running_count || waiting != s->waiting_count || staged != 0) return 6;
  if (s->free_entry_top + running + waiting != c.max_requests) return 7;
  for (int k = 0; k < s->running_count; ++k)
    if (s->entries[s->running[k]].status != kRunning) return 8;
  for (int k = 0; k < s->waiting_count; ++k)
    if (s->entries[s->waiting[(s->waiting_head + k) % c.max_requests]].status != kWaiting) return 9;
  return 0;
}

// Run fn(team) on `threads` host threads sharing a barrier, like the CTA's threads on the GPU.
template <typename Fn>
void run_team(int threads, Fn fn) {
  if (threads <= 1) {
    fn(Team{0, 1, nullptr});
    return;
  }
  HostBarrier barrier{threads, 0, 0};
  std::vector<std::thread> pool;
  for (int r = 1; r < threads; ++r) pool.emplace_back([&, r] { fn(Team{r, threads, &barrier}); });
  fn(Team{0, threads, &barrier});
  for (auto& t : pool) t.join();
}

// Run fn(team) -> int on `threads` host threads; the leader's answer (every rank gets the same from team code).
template <typename Fn>
int leader_answer(int threads, Fn fn) {
  int answer = 0;
  run_team(threads, [&](const Team& t) {
    const int a = fn(t);
    if (t.leader()) answer = a;
  });
  return answer;
}

}  // namespace

extern "C" {

uint64_t blink_sched_state_bytes(const SchedConfig* c) { return sched_carve(nullptr, *c); }

void blink_sched_init(void* state, const SchedConfig* c, uint64_t ingress_head, uint64_t arena_head,
                      uint64_t egress_tail) {
  sched_init(static_cast<SchedState*>(state), *c, ingress_head, arena_head, egress_tail);
}

// One step up to the forward, run by `threads` host threads: returns its rows (0 = idle); bucket and
// parity via blink_sched_info.
int blink_sched_prepare(const LoopParams* p, int threads) {
  return leader_answer(threads, [&](const Team& t) { return sched_prepare(t, *p); });
}

// The forward ran (the caller wrote sampled ids into buffers[launched & 1]): finish the step. With
// publish_now == 0 the records wait for blink_sched_publish, as the GPU loop publishes them only after
// its next launch; with defer_records they are not even written until blink_sched_during_forward.
void blink_sched_complete(const LoopParams* p, int threads, int publish_now, int defer_records) {
  p->state->launched++;
  run_team(threads, [&](const Team& t) { sched_complete(t, *p, publish_now != 0, defer_records != 0); });
}

// What the GPU loop does right after a launch (ingest = 1: the next step's forward now runs) or on an idle
// turn (0): the pending records, then (ingest) the requests that arrived.
void blink_sched_during_forward(const LoopParams* p, int threads, int ingest) {
  run_team(threads, [&](const Team& t) { work_during_forward(t, *p, ingest != 0); });
}

// Launching ahead (sched_ahead.h) in the GPU loop's order, where the caller launches with blink_sched_launch
// (launched + 1, as launch_step) and completes with blink_sched_complete_launched: after a step's launch and its
// work_during_forward, prepare the next step's inputs (1: written); once its forward ran, take them (1: the next
// step goes ahead: launch it, then finish_behind, which returns 0 on a mismatch; 0: complete as before).
int blink_sched_prepare_ahead(const LoopParams* p, int threads) {
  return leader_answer(threads, [&](const Team& t) { return (int)(prepare_ahead(t, *p).rows > 0); });
}
int blink_sched_take_ahead(const LoopParams* p, int threads) {
  const AheadPlan a = ahead_plan(*p);  // the GPU loop keeps it in registers across the wait
  return leader_answer(threads, [&](const Team& t) { return (int)take_ahead(t, *p, a); });
}
int blink_sched_finish_behind(const LoopParams* p, int threads) {
  return leader_answer(threads, [&](const Team& t) { return (int)finish_behind(t, *p); });
}
void blink_sched_launch(const LoopParams* p) { p->state->launched++; }
void blink_sched_complete_launched(const LoopParams* p, int threads, int publish_now, int defer_records) {
  run_team(threads, [&](const Team& t) { sched_complete(t, *p, publish_now != 0, defer_records != 0); });
}
// Team::sync_or on `threads` host threads over `rounds` rounds, each third one after a plain barrier when `mixed`
// (the two share the barrier's generations): out[r * threads + k] is what rank k saw in round r, having voted
// votes[r * threads + k].
void blink_team_votes(int threads, int rounds, const uint8_t* votes, uint8_t* out, int mixed) {
  run_team(threads, [&](const Team& t) {
    for (int r = 0; r < rounds; ++r) {
      if (mixed && r % 3 == 2) t.sync();
      out[r * threads + t.rank] = t.sync_or(votes[r * threads + t.rank] != 0);
    }
  });
}

// A row launched ahead, checked as take_ahead checks it (its AheadRow) and as stops_on does:
// out = [the row's count (-1: more ids than it holds), whether it stops on `token`, whether stops_on does].
void blink_ahead_row_check(const SchedConfig* c, const RequestDescriptor* d, int generated, int32_t token,
                           int32_t* out) {
  const AheadRow a = ahead_row(*c, *d, generated);
  out[0] = a.count;
  out[1] = ahead_row_stops(a, token);
  out[2] = stops_on(*c, *d, generated, token);
}

// [launches ahead, inputs written ahead but not taken]
void blink_sched_ahead_counts(const void* state, uint64_t* out) {
  const SchedState* s = static_cast<const SchedState*>(state);
  out[0] = s->ahead_launches;
  out[1] = s->ahead_misses;
}

void blink_sched_publish(const LoopParams* p) { publish(p->state, p->cfg, p->rings); }

// What the GPU loop posts to the other TP ranks after launching step `seq` (or kPeerStop at exit).
void blink_post_to_peers(const LoopParams* p, uint64_t seq, uint32_t command) { post_to_peers(*p, seq, command); }

// The step could not run (as after a failed launch): its requests end with ERROR.
void blink_sched_fail(const LoopParams* p, int32_t code) { fail_planned_step(*p, code); }

// The prefix cache's chain state and key (sched_prefix.h), for the test that pins them to
// blink/core/prefix_cache.py.
uint64_t blink_block_hash(uint64_t parent, const int32_t* tokens, int n) { return block_hash(parent, tokens, n); }
uint64_t blink_block_key(uint64_t state) { return block_key(state); }

// One idle turn of the GPU loop (sched_idle.h) when the plan was empty: 0 slept, 1 drained (the loop
// exits), 2 parked (the kernel ends; the host relaunches it). *idle_ns: the next backoff.
int blink_sched_idle_turn(const LoopParams* p, int32_t* idle_ns) {
  SchedState* s = p->state;
  if (s->idle_ns == 0) s->idle_ns = kIdleMinNs;
  idle_turn(*p);
  const int code = s->stopping ? 1 : s->parking ? 2 : 0;
  if (s->parking) park_done(s);
  *idle_ns = s->idle_ns;
  return code;
}

// The GPU loop's pace before a plan (sched_pace.h), the last launch `ago_ns` before now: the nanoseconds waited.
uint64_t blink_sched_pace(const LoopParams* p, int threads, uint64_t ago_ns) {
  const uint64_t last = now_ns() - ago_ns;
  uint64_t waited = 0;
  run_team(threads, [&](const Team& t) {
    const uint64_t w = pace_decodes(t, *p, last);
    if (t.leader()) waited = w;
  });
  return waited;
}

// The GPU loop's exit test on an idle turn: 1 once the front end closed ingress and all it sent finished.
int blink_sched_drain_done(const LoopParams* p) { return drain_done(p->state, p->rings) ? 1 : 0; }

// The exec table's index the GPU loop launches (sched_variant.h): device_graphs.py's table must agree.
int blink_graph_exec_index(const SchedConfig* c, int bucket, int searchless, int parity) {
  return graph_exec_index(*c, bucket, searchless, parity);
}

int blink_sched_check(const void* state, const SchedConfig* c) {
  return check_invariants(static_cast<const SchedState*>(state), *c);
}

// [running, waiting, free_blocks, free_slots, free_entries, plan_rows, plan_tokens, plan_bucket,
//  parity, preemptions, steps, tokens, error_code, fast_plans, cached_free_blocks, prefix_queries,
//  prefix_hits, resets_done, team_matches, team_shares, plan_searchless]; free_blocks counts the cached ones
//  nobody holds
void blink_sched_info(const void* state, int64_t* out) {
  const SchedState* s = static_cast<const SchedState*>(state);
  const int64_t v[] = {s->running_count, s->waiting_count, free_block_count(s), s->free_slot_top,
                       s->free_entry_top, s->plan_rows, s->plan_tokens, s->plan_bucket,
                       (int64_t)(s->launched & 1), (int64_t)s->preemptions, (int64_t)s->steps,
                       (int64_t)s->tokens, s->error_code, (int64_t)s->fast_plans, s->lru_count,
                       (int64_t)s->prefix_queries, (int64_t)s->prefix_hits, (int64_t)s->resets_done,
                       (int64_t)s->team_matches, (int64_t)s->team_shares, s->plan_searchless};
  for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); ++i) out[i] = v[i];
}

// The step being built, one (req_id, first position, tokens, samples) per row, in row order.
void blink_sched_plan(const void* state, int64_t* out) {
  const SchedState* s = static_cast<const SchedState*>(state);
  for (int r = 0; r < s->plan_rows; ++r) {
    const RequestEntry& e = s->entries[s->row_entry[r]];
    out[4 * r] = (int64_t)e.desc.req_id;
    out[4 * r + 1] = s->row_start[r];
    out[4 * r + 2] = s->row_len[r];
    out[4 * r + 3] = s->row_start[r] + s->row_len[r] == entry_num_tokens(e);
  }
}

}  // extern "C"
