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

// Team, right after step N was launched (N = launched - 1, its plan still in the state): write step N+1's
// inputs into buffer set `launched & 1`, its input ids left to take_ahead. Returns (to every rank) whether
// they were written.
BLINK_HD inline bool prepare_ahead(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  const int n = load_volatile(&s->plan_rows);
  if (t.leader()) {
    const bool off = p.hooks != nullptr && (p.hooks->no_launch_ahead || p.hooks->relaunch_each_step);
    // A fast plan with no admissions holds every running request, each as one decode row, in running order.
    s->ahead_ready = !off && n > 0 && s->fast_plan && n == s->running_count &&
                     s->num_jobs == 0 && s->plan_prompt_rows == 0 && s->launches_this_kernel < c.launches_per_kernel;
    s->ahead_stop = 0;
  }
  t.sync();
  if (!load_volatile(&s->ahead_ready)) return false;
  for (int k = t.rank; k < n; k += t.size) {  // after N: num_computed = row_start + 1, one more token out
    const RequestEntry& r = s->entries[s->row_entry[k]];
    if (at_length_limit(c, r.desc, r.num_generated + 1)) atomic_add(&s->ahead_stop, 1);
    s->row_need[k] = blocks_needed(c, r, s->row_start[k] + 2);
  }
  t.sync();
  if (t.leader()) {  // blocks as plan_decodes_fast will pop them: from the stack's top, in row order
    int need = 0;
    for (int k = 0; k < n; ++k) s->row_need[k] = s->row_need[k] ? s->free_block_top - 1 - need++ : -1;
    s->ahead_ready = s->ahead_stop == 0 && need <= s->free_block_top;
    s->ahead_rows = n;
    s->ahead_bucket = s->plan_bucket;
  }
  t.sync();
  if (!load_volatile(&s->ahead_ready)) return false;
  write_ahead_inputs(t, s, c, p.buffers[s->launched & 1], n);
  if (p.peers != nullptr)  // the other TP ranks' copies, straight into their memory (fenced in take_ahead)
    for (int k = 0; k < p.peers->num_peers; ++k) write_ahead_inputs(t, s, c, p.peers->peers[k].buffers[s->launched & 1], n);
  t.sync();
  return true;
}

// Team, in the wait loop while the forward runs (inputs written ahead): keep what take_ahead reads in L2 (each row's
// request entry, its row index; the forward's weights stream through L2 and evict them, so without this the check
// reads them from DRAM). Prefetches only: nothing waits on them, nothing changes.
BLINK_HD inline void warm_ahead(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (!load_volatile(&s->ahead_ready)) return;
  const int n = load_volatile(&s->plan_rows);
  for (int k = t.rank; k < n; k += t.size) {
    const char* entry = reinterpret_cast<const char*>(&s->entries[s->row_entry[k]]);
    for (size_t off = 0; off < sizeof(RequestEntry); off += 128) prefetch_l2(entry + off);
    prefetch_l2(&s->row_entry[k]);
  }
  if (t.leader()) prefetch_l2(&s->waiting_count);
}

// Leader: whether anything waits that the synchronous path must take in before the next step: a request it could
// admit into the very next step, anything new in the ring (a request or an abort), a held abort, a stop, a
// prefix-cache reset. A queue behind a full batch (every sequence slot taken, or the decodes filling the token
// budget) admits nothing there: schedule()'s admission loop does not start. Uses the words the wait loop
// prefetched, else reads them (the host tests, or a forward done at the first poll); the synchronous path after a
// refusal uses the same words.
BLINK_HD inline bool work_waiting(SchedState* s, const SchedConfig& c, const RingPtrs& rp) {
  if (!s->ingress_tail_valid) {
    s->ingress_tail_seen = load_acquire(&rp.ingress_header->tail);
    s->stop_seen = load_volatile(&rp.control->stop_flag) != 0;
    s->resets_seen = load_volatile(&rp.control->reset_prefix_cache);
    s->ingress_tail_valid = 1;
  }
  const bool admits = s->waiting_count != 0 && s->running_count < c.max_num_seqs &&
                      s->plan_rows < c.max_num_batched_tokens;  // no stop at this step: the same running set
  return admits || s->abort_held || s->ingress_tail_seen != s->ingress_head || s->stop_seen ||
         s->resets_seen != s->resets_done;
}

// Team, once step N's forward is done: copy its tokens into step N+1's input ids and check its rows' stops.
// Returns (to every rank) whether step N+1 goes ahead: then the leader launches it, and N is finished after.
BLINK_HD inline bool take_ahead(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  if (!load_volatile(&s->ahead_ready)) return false;
  const int n = load_volatile(&s->plan_rows);
  const StepBufferPtrs& done = p.buffers[(s->launched - 1) & 1];
  const StepBufferPtrs& next = p.buffers[s->launched & 1];
  for (int k = t.rank; k < n; k += t.size) {
    const int64_t token = load_volatile(done.sampled_ids + k);
    const RequestEntry& r = s->entries[s->row_entry[k]];
    next.input_ids[k] = token;
    if (p.peers != nullptr)
      for (int j = 0; j < p.peers->num_peers; ++j) p.peers->peers[j].buffers[s->launched & 1].input_ids[k] = token;
    if (stops_on(p.cfg, r.desc, r.num_generated + 1, (int32_t)token)) atomic_add(&s->ahead_stop, 1);
  }
  if (p.peers != nullptr) fence_system();  // this thread's peer writes, ahead and now, land before the mailboxes
  t.sync();
  if (t.leader()) {
    s->t_scheduled = now_ns();  // the rows checked (the trace's "scheduled" word of a step launched ahead)
    const bool go = load_volatile(&s->ahead_stop) == 0 && !work_waiting(s, p.cfg, p.rings);
    s->ahead_ready = 0;
    s->ahead_taken = go;
    if (go) {
      s->ingress_tail_valid = 0;  // used: the next step's words are read afresh
      s->ahead_launches++;
      s->t_ingest = s->t_plan = s->t_inputs = now_ns();
    } else {
      s->ahead_misses++;
    }
  }
  t.sync();
  return load_volatile(&s->ahead_taken) != 0;
}

// Team, after a step launched ahead (number launched - 1): finish the step before it, then plan the launched
// one as the synchronous path would (the same fast plan), and check that it is the step the forward runs.
// Returns (to every rank) false on a mismatch, a bug: the caller fails the step once its forward is done.
BLINK_HD inline bool finish_behind(const Team& t, const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  complete_launch(t, p, false, true, s->launched - 2);
  schedule(t, s, c);
  if (t.leader()) s->ahead_stop = 0;  // now: rows that disagree
  t.sync();
  const StepBufferPtrs& b = p.buffers[(s->launched - 1) & 1];
  const int n = load_volatile(&s->plan_rows);
  for (int k = t.rank; k < n; k += t.size) {
    const int e = s->row_entry[k], pos = s->row_start[k];
    const RequestEntry& r = s->entries[e];
    const int64_t slot = (int64_t)slot_blocks(s, c, r.slot)[pos / c.block_size] * c.block_size + pos % c.block_size;
    if (s->row_len[k] != 1 || b.positions[k] != pos || b.slot_mapping[k] != slot || b.sample_slots[k] != r.slot ||
        b.input_ids[k] != entry_tokens(s, c, e)[pos])
      atomic_add(&s->ahead_stop, 1);
  }
  t.sync();
  const bool same = load_volatile(&s->ahead_stop) == 0 && n == s->ahead_rows && s->plan_bucket == s->ahead_bucket;
  t.sync();  // every rank has read the flag before it is used again
  return same;
}

}  // namespace blink
