// Structured outputs at admission, on the GPU: copy a constraint's staged tables (grammar staging, in the
// shared segment: blink/transport/grammar_staging.py) into its arena partition, once per staged
// generation, and give each constrained slot its automaton state. In host mode GrammarArena._load and
// slot_grammar (blink/grammar/arena.py) do the same with torch copies; the mask and the advance are the
// same kernels in the same graphs in both modes, so nothing here runs per step.
#pragma once

#include "sched_egress.h"

namespace blink {

BLINK_HD inline bool is_constrained(const RequestDescriptor& d) { return (d.flags & kFlagConstraint) != 0; }

// A constrained descriptor must name a staging slot whose tables fit one arena partition; else it is
// refused (descriptor_problem 6). Tables the front end compiled for this arena always pass.
BLINK_HD inline bool grammar_fields_ok(const RequestDescriptor& d, const SchedConfig& c, const RingPtrs& rp) {
  if (rp.grammar_staging == nullptr || c.grammar_slots <= 0) return false;
  if (d.grammar_slot < 0 || d.grammar_slot >= c.grammar_slots || d.grammar_slot >= kGrammarSlots) return false;
  if (d.grammar_gen == 0 || d.grammar_states < 1 || d.grammar_classes < 2) return false;
  if (d.grammar_states > c.grammar_states_per_slot) return false;
  const int64_t cells = (int64_t)d.grammar_states * d.grammar_classes;
  return cells <= c.grammar_cells_per_slot && c.vocab_size + cells <= (int64_t)rp.grammar_slot_words;
}

// Word i of a staged table (the class row, then the cells) into the arena, range-checked as below.
BLINK_HD inline void grammar_store(const SamplingPtrs& sp, int64_t V, int g, int n, int nc, int64_t state_base,
                                   int64_t cell_base, int64_t i, int32_t v) {
  if (i < V) sp.grammar_classes[g * V + i] = v >= 0 && v < nc ? v : 0;
  else sp.grammar_cells[cell_base + i - V] = v >= 0 && v < n ? (int32_t)(state_base + v) : -1;
}

constexpr int kGrammarCopyUnroll = 4;  // 16-byte loads in flight per thread

// Team: copy the staged tables of this step's admissions whose partition does not hold their generation
// yet (n > 1, identical constraints and re-admissions after preemption: no copy). As GrammarArena._load:
// the class row as is, local next states + partition * states per slot, each state's first cell. The
// staged words come from another process: a value out of range becomes "never" / "disallowed", so no
// table can ever index outside its partition. Nothing to do (and no barrier) in a step without admissions.
BLINK_HD inline void grammar_copy(const Team& t, SchedState* s, const SchedConfig& c, const RingPtrs& rp,
                                  const SamplingPtrs& sp) {
  if (load_volatile(&s->num_jobs) == 0) return;  // every rank reads the plan's count after its barrier
  if (t.leader()) {
    s->num_grammar_copies = 0;
    for (int j = 0; j < s->num_jobs; ++j) {
      const RequestDescriptor& d = s->entries[s->job_entry[j]].desc;
      if (!is_constrained(d) || s->grammar_loaded_gen[d.grammar_slot] == d.grammar_gen) continue;
      s->grammar_loaded_gen[d.grammar_slot] = d.grammar_gen;
      s->grammar_copy_entry[s->num_grammar_copies++] = s->job_entry[j];
    }
  }
  t.sync();
  const int copies = load_volatile(&s->num_grammar_copies);
  const int64_t V = c.vocab_size;
  for (int k = 0; k < copies; ++k) {
    const RequestDescriptor& d = s->entries[s->grammar_copy_entry[k]].desc;
    const int g = d.grammar_slot, n = d.grammar_states, nc = d.grammar_classes;
    const int32_t* src = rp.grammar_staging + (int64_t)g * rp.grammar_slot_words;
    const int64_t state_base = (int64_t)g * c.grammar_states_per_slot, cell_base = (int64_t)g * c.grammar_cells_per_slot;
    const int64_t total = V + (int64_t)n * nc;
    // Each load is a PCIe round trip from the GPU, so the copy's speed is bytes in flight: 16-byte loads,
    // four per thread at once (4-byte loads took ~1 ms for a 2.8 MB table, by that count; not measured).
    // A slot starts 16-byte aligned (page-aligned section, slot words a multiple of 4); else words alone.
    const int64_t quads = reinterpret_cast<uintptr_t>(src) % 16 == 0 ? total / 4 : 0;
    for (int64_t q0 = t.rank; q0 < quads; q0 += kGrammarCopyUnroll * t.size) {
      Words4 v[kGrammarCopyUnroll];
      for (int u = 0; u < kGrammarCopyUnroll; ++u) {
        const int64_t q = q0 + (int64_t)u * t.size;
        if (q < quads) v[u] = load_volatile4(src + 4 * q);
      }
      for (int u = 0; u < kGrammarCopyUnroll; ++u) {
        const int64_t q = q0 + (int64_t)u * t.size;
        if (q >= quads) break;
        for (int w = 0; w < 4; ++w) grammar_store(sp, V, g, n, nc, state_base, cell_base, 4 * q + w, v[u].w[w]);
      }
    }
    for (int64_t i = 4 * quads + t.rank; i < total; i += t.size)
      grammar_store(sp, V, g, n, nc, state_base, cell_base, i, load_volatile(src + i));
    for (int i = t.rank; i < n; i += t.size) sp.grammar_row_base[state_base + i] = (int32_t)(cell_base + (int64_t)i * nc);
  }
  t.sync();
}

// The global automaton state of constrained entry e after its output so far (tables.walk over the arena,
// as slot_grammar in host mode): a re-admission after preemption by recompute walks its generated tokens,
// one lookup each; a first admission starts in its partition's initial state. -1: a token was disallowed.
BLINK_HD inline int32_t grammar_walk(SchedState* s, const SchedConfig& c, const SamplingPtrs& sp, int e) {
  const RequestEntry& r = s->entries[e];
  const int64_t g = r.desc.grammar_slot;
  const int32_t* out = entry_tokens(s, c, e) + r.desc.prompt_len;
  int32_t state = (int32_t)(g * c.grammar_states_per_slot);
  for (int k = 0; k < r.num_generated && state >= 0; ++k)
    state = sp.grammar_cells[sp.grammar_row_base[state] + sp.grammar_classes[g * c.vocab_size + out[k]]];
  return state;
}

}  // namespace blink
