// Building a step: which sequences run how many tokens (the host engine's Scheduler.schedule, rule
// for rule, so both modes batch alike), then the step's inputs in the StepBuffers of its parity.
#pragma once

#include "sched_egress.h"

namespace blink {

BLINK_HD inline void plan_add_row(SchedState* s, int e, int start, int len) {
  int row = s->plan_rows++;
  s->row_entry[row] = e;
  s->row_start[row] = start;
  s->row_len[row] = len;
  s->entries[e].planned_row = row;
  s->plan_tokens += len;
}

// Take a preemption victim's row back out of the step; returns the tokens it gives back.
BLINK_HD inline int plan_drop_row(SchedState* s, int e) {
  int row = s->entries[e].planned_row;
  if (row < 0) return 0;
  int len = s->row_len[row];
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

// Leader: running decodes, then running prefill chunks (admission order), then FCFS admissions, under
// the token budget. When blocks run out, the newest running request is preempted (recompute).
BLINK_HD inline void plan_step(SchedState* s, const SchedConfig& c) {
  s->plan_rows = s->plan_tokens = s->num_jobs = 0;
  s->plan_bucket = -1;
  int budget = c.max_num_batched_tokens, n_order = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int k = 0; k < s->running_count; ++k)
      if (entry_is_decode(s->entries[s->running[k]]) == (pass == 0)) s->order[n_order++] = s->running[k];
  for (int i = 0; i < n_order && budget > 0; ++i) {
    const int e = s->order[i];
    RequestEntry& r = s->entries[e];
    if (r.status != kRunning) continue;  // preempted earlier in this loop
    int n = entry_remaining(r) < budget ? entry_remaining(r) : budget;
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
  while (s->waiting_count > 0 && budget > 0 && s->running_count < c.max_num_seqs) {
    const int e = waiting_front(s);
    RequestEntry& r = s->entries[e];
    int n = entry_remaining(r) < budget ? entry_remaining(r) : budget;
    if (blocks_needed(c, r, r.num_computed + n) > s->free_block_top) break;  // never preempt to admit
    waiting_pop_front(s, c);
    r.status = kRunning;
    r.slot = s->free_slots[--s->free_slot_top];
    r.num_blocks = 0;
    s->running[s->running_count++] = e;
    grow_blocks(s, c, e, r.num_computed + n);
    s->job_entry[s->num_jobs++] = e;
    plan_add_row(s, e, r.num_computed, n);
    budget -= n;
  }
  for (int b = 0; b < c.num_buckets && s->plan_rows > 0; ++b)
    if (c.bucket_tokens[b] >= s->plan_tokens && c.bucket_seqs[b] >= s->plan_rows) {
      s->plan_bucket = b;
      break;
    }
  int q = 0;
  for (int r = 0; r < s->plan_rows; ++r) {
    s->row_qstart[r] = q;
    q += s->row_len[r];
  }
}

// Team: write each admitted request's sampling parameters into its slot (SamplingState.set_slot).
BLINK_HD inline void write_admissions(const Team& t, SchedState* s, const SchedConfig& c, const SamplingPtrs& sp) {
  const int64_t V = c.vocab_size;
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
      sp.flags[slot] = (penalties ? kFlagPenalties : 0) | (nb > 0 ? kFlagLogitBias : 0);
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
      if (k < prompt) sp.prompt_mask[r.slot * V + toks[k]] = 1;
      else atomic_add(&sp.output_counts[r.slot * V + toks[k]], 1);
    }
  }
}

// Team: the step's inputs, padded to its bucket (padding rows empty, padding tokens slot -1).
BLINK_HD inline void write_inputs(const Team& t, SchedState* s, const SchedConfig& c, const StepBufferPtrs& b) {
  const int rows = s->plan_rows, tokens = s->plan_tokens, bs = c.block_size, mb = c.max_blocks_per_seq;
  const int T = c.bucket_tokens[s->plan_bucket], S = c.bucket_seqs[s->plan_bucket];
  for (int row = 0; row < rows; ++row) {
    const int e = s->row_entry[row], start = s->row_start[row], len = s->row_len[row], q0 = s->row_qstart[row];
    const RequestEntry& r = s->entries[e];
    const int32_t* toks = entry_tokens(s, c, e);
    const int32_t* table = slot_blocks(s, c, r.slot);
    for (int k = t.rank; k < len; k += t.size) {
      const int p = start + k;
      b.input_ids[q0 + k] = toks[p];
      b.positions[q0 + k] = p;
      b.slot_mapping[q0 + k] = (int64_t)table[p / bs] * bs + p % bs;
    }
    for (int j = t.rank; j < r.num_blocks; j += t.size) b.block_tables[(int64_t)row * mb + j] = table[j];
  }
  for (int k = tokens + t.rank; k < T; k += t.size) {
    b.input_ids[k] = 0;
    b.positions[k] = 0;
    b.slot_mapping[k] = -1;
  }
  for (int row = t.rank; row <= S; row += t.size) b.query_start_loc[row] = row < rows ? s->row_qstart[row] : tokens;
  for (int row = t.rank; row < S; row += t.size) {
    if (row < rows) {
      const RequestEntry& r = s->entries[s->row_entry[row]];
      const int end = s->row_start[row] + s->row_len[row];
      b.seq_lens[row] = end;
      b.logits_indices[row] = s->row_qstart[row] + s->row_len[row] - 1;
      b.sample_slots[row] = end == entry_num_tokens(r) ? r.slot : c.max_num_seqs;
      b.sample_positions[row] = entry_num_tokens(r);
    } else {
      b.seq_lens[row] = 0;
      b.logits_indices[row] = 0;
      b.sample_slots[row] = c.max_num_seqs;
      b.sample_positions[row] = 0;
    }
  }
}

}  // namespace blink
