// Which of a bucket's forward graphs a step launches. With SchedConfig.sampler_variants = 2 each decode bucket
// also has a graph whose sampler leaves its threshold search out (blink/kernels/sampling.py, search=False): a
// step takes it when none of its rows needs the search, as ModelRunner.needs_search decides in host mode. The
// exec table is cudaGraphExec_t[sampler_variants][num_buckets][2]; a bucket without that graph repeats its own.
#pragma once

#include "sched_queue.h"

namespace blink {

// SamplingParams.needs_search: sampled with a filter, or asking for top-K logprobs. On the descriptor's floats,
// which are what the sampler reads (Python's doubles can only say "search" where this says not: the safe side).
BLINK_HD inline bool needs_search(const RequestDescriptor& d) {
  const bool filtered = d.temperature != 0.f && (d.top_k > 0 || d.top_p < 1.f || d.min_p > 0.f);
  return filtered || d.num_logprobs > 0;
}

// Team, after schedule() and a sync: plan_searchless for the planned rows that sample (0 without the variants or
// a bucket).
BLINK_HD inline void plan_variant(const Team& t, SchedState* s, const SchedConfig& c) {
  const int n = load_volatile(&s->plan_rows), b = load_volatile(&s->plan_bucket);
  const bool possible = c.sampler_variants > 1 && n > 0 && b >= 0;
  bool search = false;
  for (int k = t.rank; possible && k < n; k += t.size)  // a row mid-prefill samples the scratch slot: unread
    search |= row_samples(s, k) && needs_search(s->entries[s->row_entry[k]].desc);
  const bool searchless = possible && !t.sync_or(search);
  if (t.leader()) s->plan_searchless = searchless;
  t.sync();
}

// The exec table's index of a bucket's graph.
BLINK_HD inline int graph_exec_index(const SchedConfig& c, int bucket, int searchless, int parity) {
  return ((searchless ? c.num_buckets : 0) + bucket) * 2 + parity;
}

}  // namespace blink
