// Launching ahead (issue 17's control gap): while step N's forward runs, the team writes step N+1's inputs for
// the case that nothing changes, the steady state of decoding: every running request was in N as a decode row,
// none reaches a length limit at N, and no waiting request could be admitted. Once N's tokens are in, the gap
// between the two forwards holds only their copy into N+1's input ids and the stop check (take_ahead). If a row
// stopped, a request arrived that could be admitted, or an abort, a stop or a cache reset waits, the inputs are
// dropped and the step is planned as before (nothing was changed: the inputs written ahead are state-free, their
// KV blocks only reserved). A step launched ahead is then finished, and the next one planned, while the next
// forward runs: the same decisions as the synchronous path, which finish_behind checks against what was launched.
#pragma once

#include "sched.h"
#include "sched_pace.h"

namespace blink {

// Team: step N+1's inputs (every row one decode token, one position on from step N's), but its input ids, into `b`.
BLINK_HD inline void write_ahead_inputs(const Team& t, SchedState* s, const SchedConfig& c, const StepBufferPtrs& b,
                                        int n) {
  const int T = c.bucket_tokens[s->plan_bucket], S = c.bucket_seqs[s->plan_bucket], bs = c.block_size;
  const int mb = c.max_blocks_per_seq;
  for (int q = t.rank; q < T; q += t.size) {  // row q is token q; its input id comes with N's token
    if (q >= n) {
      b.input_ids[q] = 0;
      b.positions[q] = 0;
      b.slot_mapping[q] = -1;
      continue;
    }
    const RequestEntry& r = s->entries[s->row_entry[q]];
    const int pos = s->row_start[q] + 1, j = pos / bs;
    const int block = j < r.num_blocks ? slot_blocks(s, c, r.slot)[j] : s->free_blocks[s->row_need[q]];
    b.positions[q] = pos;
    b.slot_mapping[q] = (int64_t)block * bs + pos % bs;
  }
  for (int row = t.rank; row <= S; row += t.size) b.query_start_loc[row] = row < n ? row : n;
  for (int row = t.rank; row < S; row += t.size) {
    const bool real = row < n;
    const int len = real ? s->row_start[row] + 2 : 0;
    b.seq_lens[row] = len;
    b.logits_indices[row] = real ? row : 0;
    b.sample_slots[row] = real ? s->entries[s->row_entry[row]].slot : c.max_num_seqs;
    b.sample_positions[row] = len;
  }
  for (int i = t.rank; i < n * mb; i += t.size) {
    const int row = i / mb, j = i % mb;
    if (j * bs >= s->row_start[row] + 2) continue;
    const RequestEntry& r = s->entries[s->row_entry[row]];
    b.block_tables[(int64_t)row * mb + j] = j < r.num_blocks ? slot_blocks(s, c, r.slot)[j] : s->free_blocks[s->row_need[row]];
  }
  const int P = c.prompt_logprob_rows < T ? c.prompt_logprob_rows : T;
  for (int k = t.rank; k < P; k += t.size) {
    b.prompt_rows[k] = 0;
    b.prompt_targets[k] = -1;
    b.prompt_num_top[k] = 0;
  }
}

// What the check after the wait needs, read before it (registers across the wait on the GPU): the rows written
// ahead (0: none), where step N's tokens are and N+1's go, their checks, and N+1's graph.
struct AheadPlan {
  int rows;
  const int64_t* sampled;
  int64_t* input_ids;
  const AheadRow* check;
  void* exec;  // cudaGraphExec_t of N+1's bucket and parity (nullptr in the host build)
};

// The inputs written ahead, as the state holds them between the host tests' calls (rows 0: none).
BLINK_HD inline AheadPlan ahead_plan(const LoopParams& p) {
  const SchedState* s = p.state;
  const int parity = (int)(s->launched & 1);
#if defined(__CUDA_ARCH__)
  const int index = graph_exec_index(p.cfg, s->ahead_bucket, s->ahead_searchless, parity);
  void* exec = static_cast<void**>(p.graph_execs)[index];
#else
  void* exec = nullptr;  // the host tests launch nothing
#endif
  return AheadPlan{s->ahead_ready ? s->ahead_rows : 0, p.buffers[parity ^ 1].sampled_ids,
                   p.buffers[parity].input_ids, s->ahead_check, exec};
}

// A row's stop check at its next token (token number `generated`): stops_on's ids, if they fit, else count -1.
BLINK_HD inline AheadRow ahead_row(const SchedConfig& c, const RequestDescriptor& d, int generated) {
  AheadRow a{};
  if (generated - 1 < (int)d.min_tokens) return a;
  int n = 0;
  for (uint32_t k = 0; k < d.num_stop_ids; ++k, ++n)
    if (n < kAheadIds) a.ids[n] = d.stop_token_ids[k];
  if (!(d.flags & kFlagIgnoreEos))
    for (int k = 0; k < c.num_eos; ++k, ++n)
      if (n < kAheadIds) a.ids[n] = c.eos_ids[k];
  a.count = n <= kAheadIds ? n : -1;
  return a;
}

// Whether a row's check stops it on `token` (count >= 0; a fixed bound, so the GPU keeps the row in registers).
BLINK_HD inline bool ahead_row_stops(const AheadRow& a, int32_t token) {
  bool stop = false;
  for (int j = 0; j < kAheadIds; ++j) stop |= j < a.count && a.ids[j] == token;
  return stop;
}

// Team, right after step N was launched (N = launched - 1, its plan still in the state): write step N+1's
// inputs into buffer set `launched & 1`, its input ids left to take_ahead, and each row's stop check. Returns (to
// every rank) the plan the check needs; rows 0: nothing written.
BLINK_HD inline AheadPlan prepare_ahead(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  const int n = load_volatile(&s->plan_rows);
  bool ready = false;
  if (t.leader()) {
    // Paced decodes (sched_pace.h) start after their pause, never right after the last forward.
    const bool off = (p.hooks != nullptr && (p.hooks->no_launch_ahead || p.hooks->relaunch_each_step)) ||
                     pace_holds(c, s->running_count);
    // A fast plan with no admissions holds every running request, each as one decode row, in running order.
    ready = !off && n > 0 && s->fast_plan && n == s->running_count && s->num_jobs == 0 &&
            s->plan_prompt_rows == 0 && s->launches_this_kernel < c.launches_per_kernel;
    s->ahead_ready = 0;
  }
  AheadPlan none{};
  if (!t.sync_or(ready)) return none;
  bool limit = false;
  for (int k = t.rank; k < n; k += t.size) {  // after N: num_computed = row_start + 1, one more token out
    const RequestEntry& r = s->entries[s->row_entry[k]];
    limit |= at_length_limit(c, r.desc, r.num_generated + 1);
    s->row_need[k] = blocks_needed(c, r, s->row_start[k] + 2);
    s->ahead_check[k] = ahead_row(c, r.desc, r.num_generated + 1);  // N's token is number num_generated + 1
  }
  if (t.sync_or(limit)) return none;
  if (t.leader()) {  // blocks as plan_decodes_fast will pop them: from the stack's top, in row order
    int need = 0;
    for (int k = 0; k < n; ++k) s->row_need[k] = s->row_need[k] ? s->free_block_top - 1 - need++ : -1;
    ready = need <= s->free_block_top;
    s->ahead_ready = ready;
    s->ahead_rows = n;
    s->ahead_bucket = s->plan_bucket;
    s->ahead_searchless = s->plan_searchless;  // the same rows, so the same variant
  }
  if (!t.sync_or(ready)) return none;
  write_ahead_inputs(t, s, c, p.buffers[s->launched & 1], n);
  if (p.peers != nullptr)  // the other TP ranks' copies, straight into their memory (fenced in take_ahead)
    for (int k = 0; k < p.peers->num_peers; ++k) write_ahead_inputs(t, s, c, p.peers->peers[k].buffers[s->launched & 1], n);
  t.sync();
  return ahead_plan(p);
}

// Team, in the wait loop while the forward runs (inputs written ahead): keep the rows' checks, and the state words
// work_waiting reads, in L2 (the forward's weights stream through L2 and evict them, so without this the check
// reads them from DRAM). Prefetches only.
BLINK_HD inline void warm_ahead(const Team& t, const SchedState* s, const AheadPlan& a) {
  const char* rows = reinterpret_cast<const char*>(a.check);
  for (int off = t.rank * 128; off < a.rows * (int)sizeof(AheadRow); off += t.size * 128) prefetch_l2(rows + off);
  if (t.leader() && a.rows > 0) {
    prefetch_l2(&s->ingress_head);
    prefetch_l2(&s->waiting_count);
    prefetch_l2(&s->resets_done);
    prefetch_l2(&s->abort_held);
  }
}

// Leader: whether anything waits that the synchronous path must take in before the next step: a request it could
// admit into the very next step, anything new in the ring (a request or an abort), a held abort, a stop, a
// prefix-cache reset. A queue behind a full batch (every sequence slot taken, or the decodes filling the token
// budget) admits nothing there: schedule()'s admission loop does not start. Uses the words the wait loop
// prefetched, else reads them (the host tests, or a forward done at the first poll); the synchronous path after a
// refusal uses the same words.
BLINK_HD inline bool work_waiting(SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  if (!s->ingress_tail_valid) read_host_words(s, rp);
  const bool admits = s->waiting_count != 0 && s->running_count < c.max_num_seqs &&
                      s->plan_rows < c.max_num_batched_tokens;  // no stop at this step: the same running set
  return admits || s->abort_held || s->ingress_tail_seen != s->ingress_head || s->stop_seen ||
         s->resets_seen != s->resets_done;
}

// Team, once step N's forward is done: copy its tokens into step N+1's input ids and check its rows' stops, while
// the leader checks what waits (with a team of more than one the leader takes no rows: both are one round trip).
// Returns (to every rank) whether step N+1 goes ahead: then the leader launches it, and N is finished after.
BLINK_HD inline bool take_ahead(const Team& t, const LoopParams& p, const AheadPlan& a) {
  if (a.rows == 0) return false;
  SchedState* s = p.state;
  bool vote = false;
  if (t.leader()) vote = work_waiting(s, p.cfg, p.rings);
  const int first = t.size > 1 ? t.rank - 1 : 0, step = t.size > 1 ? t.size - 1 : 1;
  for (int k = first; k >= 0 && k < a.rows; k += step) {
    const int64_t token = load_volatile(a.sampled + k);
    const AheadRow check = a.check[k];
    a.input_ids[k] = token;
    if (p.peers != nullptr)
      for (int j = 0; j < p.peers->num_peers; ++j) p.peers->peers[j].buffers[s->launched & 1].input_ids[k] = token;
    bool stop = ahead_row_stops(check, (int32_t)token);
    if (check.count < 0) {  // more ids than a check holds: the entry's own
      const RequestEntry& r = s->entries[s->row_entry[k]];
      stop = stops_on(p.cfg, r.desc, r.num_generated + 1, (int32_t)token);
    }
    vote |= stop;
  }
  if (p.peers != nullptr) fence_system();  // this thread's peer writes, ahead and now, land before the mailboxes
  const bool go = !t.sync_or(vote);
  if (t.leader()) {
    s->t_scheduled = now_ns();  // the rows checked (the trace's "scheduled" word of a step launched ahead)
    s->ahead_ready = 0;
    if (go) {
      s->ingress_tail_valid = 0;  // used: the next step's words are read afresh
      s->ahead_launches++;
      s->t_ingest = s->t_plan = s->t_inputs = now_ns();
    } else {
      s->ahead_misses++;
    }
  }
  return go;
}

// Team, after a step launched ahead (number launched - 1): finish the step before it, then plan the launched
// one as the synchronous path would (the same fast plan), and check that it is the step the forward runs.
// Returns (to every rank) false on a mismatch, a bug: the caller fails the step once its forward is done.
BLINK_HD inline bool finish_behind(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  complete_launch(t, p, false, true, s->launched - 2);
  schedule(t, s, c);
  t.sync();
  plan_variant(t, s, c);
  const StepBufferPtrs& b = p.buffers[(s->launched - 1) & 1];
  const int n = load_volatile(&s->plan_rows);
  bool differ = false;
  for (int k = t.rank; k < n; k += t.size) {
    const int e = s->row_entry[k], pos = s->row_start[k];
    const RequestEntry& r = s->entries[e];
    const int64_t slot = (int64_t)slot_blocks(s, c, r.slot)[pos / c.block_size] * c.block_size + pos % c.block_size;
    differ |= s->row_len[k] != 1 || b.positions[k] != pos || b.slot_mapping[k] != slot || b.sample_slots[k] != r.slot ||
              b.input_ids[k] != entry_tokens(s, c, e)[pos];
  }
  return !t.sync_or(differ || (t.leader() && (n != s->ahead_rows || s->plan_bucket != s->ahead_bucket ||
                                               s->plan_searchless != s->ahead_searchless)));
}

}  // namespace blink
