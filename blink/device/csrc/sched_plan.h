// Building a step: which sequences run how many tokens (the host engine's Scheduler.schedule, rule
// for rule, so both modes batch alike), then the step's inputs in the StepBuffers of its parity.
#pragma once

#include "sched_grammar.h"
#include "sched_prefix.h"

namespace blink {

BLINK_HD inline void plan_add_row(SchedState* s, int e, int start, int len) {
  int row = s->plan_rows++;
  s->row_entry[row] = e;
  s->row_start[row] = start;
  s->row_len[row] = len;
  s->entries[e].planned_row = row;
  s->plan_tokens += len;
  s->plan_prompt_rows += entry_prompt_rows(s->entries[e], start, len);
}

// Take a preemption victim's row back out of the step; returns the tokens it gives back.
BLINK_HD inline int plan_drop_row(SchedState* s, int e) {
  int row = s->entries[e].planned_row;
  if (row < 0) return 0;
  int len = s->row_len[row];
  s->plan_prompt_rows -= entry_prompt_rows(s->entries[e], s->row_start[row], len);
  for (int r = row; r + 1 < s->plan_rows; ++r) {
    s->row_entry[r] = s->row_entry[r + 1];
    s->row_start[r] = s->row_start[r + 1];
    s->row_len[r] = s->row_len[r + 1];
    s->entries[s->row_entry[r]].planned_row = r;
  }
  s->plan_rows--;
  s->plan_tokens -= len;
  s->entries[e].planned_row = -1;
  return len;
}

// Leader: running decodes, then running prefill chunks (admission order) under the token budget. When
// blocks run out, the newest running request is preempted (recompute). Returns the budget left.
BLINK_HD inline int plan_running(SchedState* s, const SchedConfig& c) {
  int budget = c.max_num_batched_tokens, n_order = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int k = 0; k < s->running_count; ++k)
      if (entry_is_decode(s->entries[s->running[k]]) == (pass == 0)) s->order[n_order++] = s->running[k];
  for (int i = 0; i < n_order && budget > 0; ++i) {
    const int e = s->order[i];
    RequestEntry& r = s->entries[e];
    if (r.status != kRunning) continue;  // preempted earlier in this loop
    int n = prompt_cap(s, c, r, r.num_computed, entry_remaining(r) < budget ? entry_remaining(r) : budget);
    if (n == 0) continue;
    while (!grow_blocks(s, c, e, r.num_computed + n)) {
      const int victim = s->running[s->running_count - 1];
      budget += plan_drop_row(s, victim);
      preempt(s, c, victim);
      if (victim == e) break;
    }
    if (r.status == kRunning) {
      plan_add_row(s, e, r.num_computed, n);
      budget -= n;
    }
  }
  return budget;
}

// Team: the steady state, every running request decoding and all of them fitting (budget, blocks), is
// what plan_running decides too, computed one thread per request; blocks are popped in row order, as
// there. Returns (to every rank) whether it applied; if not, nothing changed and the leader plans.
BLINK_HD inline bool plan_decodes_fast(const Team& t, SchedState* s, const SchedConfig& c) {
  const int n = s->running_count;
  if (t.leader()) s->not_decode = 0;
  t.sync();
  for (int k = t.rank; k < n; k += t.size) {
    const RequestEntry& r = s->entries[s->running[k]];
    if (!entry_is_decode(r)) atomic_add(&s->not_decode, 1);
    s->row_need[k] = blocks_needed(c, r, r.num_computed + 1);
  }
  t.sync();
  if (t.leader()) {
    int need = 0;
    for (int k = 0; k < n; ++k) s->row_need[k] = s->row_need[k] ? s->free_block_top - 1 - need++ : -1;
    s->fast_plan = n > 0 && load_volatile(&s->not_decode) == 0 && n <= c.max_num_batched_tokens &&
                   need <= s->free_block_top;
    if (s->fast_plan) {
      s->free_block_top -= need;
      s->fast_plans++;
      s->plan_rows = s->plan_tokens = n;
    }
  }
  t.sync();
  if (!load_volatile(&s->fast_plan)) return false;
  for (int k = t.rank; k < n; k += t.size) {
    const int e = s->running[k];
    RequestEntry& r = s->entries[e];
    if (s->row_need[k] >= 0) {  // take_block's stack path, one distinct block per thread
      const int b = s->free_blocks[s->row_need[k]];
      s->block_ref[b] = 1;
      s->block_gen[b]++;
      slot_blocks(s, c, r.slot)[r.num_blocks++] = b;
    }
    s->row_entry[k] = e;
    s->row_start[k] = r.num_computed;
    s->row_len[k] = 1;
    s->row_qstart[k] = k;
    r.planned_row = k;
  }
  t.sync();
  return true;
}

// Team: the whole plan (Scheduler.schedule() in blink/core/scheduler.py, decision for decision). Decodes
// (fast path or leader), then FCFS admissions under what is left of the budget, then the bucket and each
// row's first query index.
BLINK_HD inline void schedule(const Team& t, SchedState* s, const SchedConfig& c) {
  if (t.leader()) {
    s->plan_rows = s->plan_tokens = s->num_jobs = s->plan_prompt_rows = 0;
    s->plan_bucket = -1;
  }
  t.sync();
  const bool fast = plan_decodes_fast(t, s, c);
  if (t.leader()) s->plan_budget = fast ? c.max_num_batched_tokens - s->plan_tokens : plan_running(s, c);
  prefix_match_ahead(t, s, c);  // team: the waiting front's prefix hits, in parallel (issue 16)
  if (!t.leader()) return;
  int budget = s->plan_budget;
  const int first_new = s->plan_rows;
  while (s->waiting_count > 0 && budget > 0 && s->running_count < c.max_num_seqs) {
    const int e = waiting_front(s);
    RequestEntry& r = s->entries[e];
    // Any admission needs a fresh block (for its last token, at least): skip the match while the pool is
    // exhausted, the common case of a waiting queue under memory pressure.
    if (free_block_count(s) == 0) break;
    // With prompt logprobs it skips the cache: cached positions would have no logits.
    const bool plp = prompt_top_for(r.desc) >= 0 && r.num_generated == 0;  // Sequence.wants_prompt_logprobs
    const PrefixMatch m = plp ? PrefixMatch{0, 0, 0, -1, 0, nullptr, -1}
                              : prefix_match_admit(s, c, e, s->num_jobs);  // the cached prefix (issue 16)
    const int cached = m.num_blocks * c.block_size, rest = entry_num_tokens(r) - cached;
    const int n = prompt_cap(s, c, r, cached, rest < budget ? rest : budget);
    if (n == 0) break;  // FCFS: it waits for a step with prompt-logprob rows left
    const int need = (cached + n + c.block_size - 1) / c.block_size - m.num_blocks;
    if (need > free_block_count(s) - m.num_in_lru) break;  // never preempt to admit
    waiting_pop_front(s, c);
    r.status = kRunning;
    if (!r.admitted) {  // the first admission ends the queue time (a preempted request keeps its first)
      const uint64_t us = (now_ns() - r.arrived_ns) / 1000;
      r.queue_us = us > 0xffffffffull ? 0xffffffffu : (uint32_t)us;
      r.admitted = 1;
    }
    r.slot = s->free_slots[--s->free_slot_top];
    r.num_blocks = 0;
    s->running[s->running_count++] = e;
    if (plp) {  // Scheduler.schedule's uncached admission: no lookup counted, its blocks chain afresh
      r.num_computed = r.num_hashed = 0;
      r.chain_hash = 0;
      r.chain_parent = -1;
      r.chain_parent_gen = 0;
      if (r.num_cached_tokens < 0) r.num_cached_tokens = 0;
    } else {
      prefix_admit(s, c, e, m);  // before growing: the hit's blocks leave the LRU, never evicted here
    }
    grow_blocks(s, c, e, cached + n);
    s->job_entry[s->num_jobs++] = e;
    plan_add_row(s, e, r.num_computed, n);
    budget -= n;
  }
  for (int b = 0; b < c.num_buckets && s->plan_rows > 0; ++b)
    if (c.bucket_tokens[b] >= s->plan_tokens && c.bucket_seqs[b] >= s->plan_rows) {
      s->plan_bucket = b;
      break;
    }
  int q = fast ? first_new : 0;  // the fast path set its rows' (one token each: row k starts at k)
  for (int r = fast ? first_new : 0; r < s->plan_rows; ++r) {
    s->row_qstart[r] = q;
    q += s->row_len[r];
  }
}

// Top logprobs a request asks for: its records carry that many; the sampler computes them only for
// slots whose num_logprobs is > 0 (descriptor: -1 = none, 0 = the chosen token's logprob only).
BLINK_HD inline int num_top_for(const RequestDescriptor& d) {
  return d.num_logprobs < 0 ? 0 : d.num_logprobs > kMaxTopLogprobs ? kMaxTopLogprobs : d.num_logprobs;
}

// Team: write each admitted request's sampling parameters into its slot (SamplingState.set_slot), a
// constrained one's grammar after its tables are in the arena (sched_grammar.h).
BLINK_HD inline void write_admissions(const Team& t, SchedState* s, const SchedConfig& c, const SamplingPtrs& sp,
                                      const RingPtrs& rp) {
  const int64_t V = c.vocab_size;
  grammar_copy(t, s, c, rp, sp);
  for (int j = 0; j < s->num_jobs; ++j) {
    const int e = s->job_entry[j];
    const RequestEntry& r = s->entries[e];
    const RequestDescriptor& d = r.desc;
    const int slot = r.slot, nb = (int)d.num_logit_bias;
    const bool penalties = d.presence_penalty != 0.f || d.frequency_penalty != 0.f || d.repetition_penalty != 1.f;
    if (t.leader()) {
      sp.temperature[slot] = d.temperature;
      sp.top_p[slot] = d.top_p;
      sp.top_k[slot] = d.top_k;
      sp.min_p[slot] = d.min_p;
      sp.presence_penalty[slot] = d.presence_penalty;
      sp.frequency_penalty[slot] = d.frequency_penalty;
      sp.repetition_penalty[slot] = d.repetition_penalty;
      sp.seed[slot] = (int64_t)d.seed;
      sp.flags[slot] = (penalties ? kFlagPenalties : 0) | (nb > 0 ? kFlagLogitBias : 0) |
                       (is_constrained(d) ? kFlagGrammar : 0);
      sp.num_logprobs[slot] = num_top_for(d);
      sp.grammar_id[slot] = is_constrained(d) ? d.grammar_slot : 0;
      sp.grammar_state[slot] = is_constrained(d) ? grammar_walk(s, c, sp, e) : -1;
    }
    for (int k = t.rank; k < kMaxLogitBias; k += t.size) {
      sp.bias_ids[(int64_t)slot * kMaxLogitBias + k] = k < nb ? s->bias_ids[(int64_t)e * kMaxLogitBias + k] : -1;
      sp.bias_vals[(int64_t)slot * kMaxLogitBias + k] = k < nb ? s->bias_vals[(int64_t)e * kMaxLogitBias + k] : 0.f;
    }
    if (!penalties) continue;  // counts and mask are read only under FLAG_PENALTIES: leave them stale
    for (int64_t v = t.rank; v < V; v += t.size) {
      sp.output_counts[slot * V + v] = 0;
      sp.prompt_mask[slot * V + v] = 0;
    }
  }
  t.sync();
  for (int j = 0; j < s->num_jobs; ++j) {
    const RequestEntry& r = s->entries[s->job_entry[j]];
    const RequestDescriptor& d = r.desc;
    if (!(d.presence_penalty != 0.f || d.frequency_penalty != 0.f || d.repetition_penalty != 1.f)) continue;
    const int32_t* toks = entry_tokens(s, c, s->job_entry[j]);
    const int prompt = (int)d.prompt_len;
    for (int k = t.rank; k < prompt + r.num_generated; k += t.size) {
      if (k < prompt) store_relaxed(&sp.prompt_mask[r.slot * V + toks[k]], (uint8_t)1);  // repeated tokens
      else atomic_add(&sp.output_counts[r.slot * V + toks[k]], 1);
    }
  }
}

// Row of query index q: the last row whose first query index is <= q (binary search, rows >= 1).
BLINK_HD inline int row_of_query(const SchedState* s, int q) {
  int lo = 0, hi = s->plan_rows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s->row_qstart[mid] <= q) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Team: the step's inputs, padded to its bucket (padding rows empty, padding tokens slot -1). Every
// loop is flat over the team: per token, per row, per block-table entry.
BLINK_HD inline void write_inputs(const Team& t, SchedState* s, const SchedConfig& c, const StepBufferPtrs& b) {
  const int rows = s->plan_rows, tokens = s->plan_tokens, bs = c.block_size, mb = c.max_blocks_per_seq;
  const int T = c.bucket_tokens[s->plan_bucket], S = c.bucket_seqs[s->plan_bucket];
  for (int q = t.rank; q < T; q += t.size) {
    if (q >= tokens) {
      b.input_ids[q] = 0;
      b.positions[q] = 0;
      b.slot_mapping[q] = -1;
      continue;
    }
    const int row = row_of_query(s, q), e = s->row_entry[row];
    const int p = s->row_start[row] + q - s->row_qstart[row];
    const int32_t* table = slot_blocks(s, c, s->entries[e].slot);
    b.input_ids[q] = entry_tokens(s, c, e)[p];
    b.positions[q] = p;
    b.slot_mapping[q] = (int64_t)table[p / bs] * bs + p % bs;
  }
  for (int row = t.rank; row <= S; row += t.size) b.query_start_loc[row] = row < rows ? s->row_qstart[row] : tokens;
  for (int row = t.rank; row < S; row += t.size) {
    if (row < rows) {
      const RequestEntry& r = s->entries[s->row_entry[row]];
      const int end = s->row_start[row] + s->row_len[row];
      b.seq_lens[row] = end;
      b.logits_indices[row] = s->row_qstart[row] + s->row_len[row] - 1;
      b.sample_slots[row] = row_samples(s, row) ? r.slot : c.max_num_seqs;
      b.sample_positions[row] = entry_num_tokens(r);
    } else {
      b.seq_lens[row] = 0;
      b.logits_indices[row] = 0;
      b.sample_slots[row] = c.max_num_seqs;
      b.sample_positions[row] = 0;
    }
  }
  // Block tables: only the blocks covering each row's sequence (attention reads no further).
  for (int i = t.rank; i < rows * mb; i += t.size) {
    const int row = i / mb, j = i % mb;
    const int end = s->row_start[row] + s->row_len[row];
    if (j * bs >= end) continue;
    b.block_tables[(int64_t)row * mb + j] = slot_blocks(s, c, s->entries[s->row_entry[row]].slot)[j];
  }
  // Prompt logprobs (ModelRunner.prompt_inputs): each planned row's prompt positions, in row order, then
  // padding (target -1) up to the min(P, T) rows the bucket's graph reads.
  const int P = c.prompt_logprob_rows < T ? c.prompt_logprob_rows : T;
  int k0 = 0;
  for (int row = 0; row < rows && k0 < s->plan_prompt_rows; ++row) {
    const int e = s->row_entry[row];
    const RequestEntry& r = s->entries[e];
    const int n = entry_prompt_rows(r, s->row_start[row], s->row_len[row]);
    const int32_t* toks = entry_tokens(s, c, e);
    for (int j = t.rank; j < n; j += t.size) {
      b.prompt_rows[k0 + j] = s->row_qstart[row] + j;
      b.prompt_targets[k0 + j] = toks[s->row_start[row] + j + 1];
      b.prompt_num_top[k0 + j] = prompt_top_for(r.desc);
    }
    k0 += n;
  }
  for (int k = k0 + t.rank; k < P; k += t.size) {
    b.prompt_rows[k] = 0;
    b.prompt_targets[k] = -1;
    b.prompt_num_top[k] = 0;
  }
}

}  // namespace blink
