// Issue 19, energy per token: `--decode-pace-ms` in device mode (host mode's twin: blink/host/pace.py).
// At a given load a faster engine runs more, smaller steps, and every step reads all the weights: at 24 req/s
// device mode ran 1,499 steps of 33 tokens where host mode ran 1,145 of 43, for +0.8-3.6% GPU energy per token.
// The pace trades decode speed for fewer, fuller steps: a step that can only be decodes starts no sooner than
// decode_pace_us after the last launch. A new request or a stop ends the wait, so prefills are never paced.
// The wait is on the GPU, per step; the CPU does nothing. With decode_pace_max_batch > 0 only batches of at most
// that many running requests are held: they read every weight for few tokens, and a full batch keeps its speed.
#pragma once

#include "sched.h"

namespace blink {

// Whether the pace may hold a step of this many running requests (the launch-ahead is off while it may).
BLINK_HD inline bool pace_holds(const SchedConfig& c, int running) {
  return c.decode_pace_us > 0 && (c.decode_pace_max_batch <= 0 || running <= c.decode_pace_max_batch);
}

constexpr uint32_t kPacePollNs = 20000;  // a request arriving during a pause waits at most this for the next plan

// Team: whether the pace asks for a wait before the next plan: it can only be decodes (nothing waits, and every
// running request has its prompt done: a team scan, as plan_decodes_fast's), and the pace since the launch at
// last_launch_ns is not over (by the leader's clock, `now`).
BLINK_HD inline bool pace_applies(const Team& t, const LoopParams& p, uint64_t last_launch_ns, uint64_t now) {
  const SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  const bool early = pace_holds(c, s->running_count) && s->launched > 0 && s->waiting_count == 0 &&
                     s->running_count > 0 && now < last_launch_ns + (uint64_t)c.decode_pace_us * 1000u;
  if (!t.sync_or(t.leader() && early)) return false;
  bool prefill = false;
  for (int k = t.rank; k < s->running_count; k += t.size) prefill |= !entry_is_decode(s->entries[s->running[k]]);
  return !t.sync_or(prefill);
}

// Team, before the plan: the pace's wait, if it applies. The last step's tokens go out first (they would
// otherwise wait for the next launch), then the leader sleeps in kPacePollNs slices, reading the host's words
// (read_host_words) between them: the ones it read last are the plan's.
// Returns (to the leader) the nanoseconds waited.
BLINK_HD inline uint64_t pace_decodes(const Team& t, const LoopParams& p, uint64_t last_launch_ns) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  const uint64_t start = t.leader() ? now_ns() : 0;
  if (!pace_applies(t, p, last_launch_ns, start)) return 0;
  flush_pending_records(t, p);
  uint64_t now = start;
  if (t.leader()) {
    publish(s, c, p.rings);
    const uint64_t until = last_launch_ns + (uint64_t)c.decode_pace_us * 1000u;
    while (true) {
      read_host_words(s, p.rings);
      now = now_ns();
      if (now >= until || s->ingress_tail_seen != s->ingress_head || s->stop_seen ||
          s->resets_seen != s->resets_done)
        break;
      const uint64_t left = until - now;
      pause_ns(left < kPacePollNs ? (uint32_t)left : kPacePollNs);
    }
  }
  t.sync();
  return now - start;
}

}  // namespace blink
