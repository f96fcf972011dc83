// The GPU loop's idle turns (issue 19, idle energy), host and device: the backoff, the drain's end, parking.
#pragma once

#include "sched.h"

namespace blink {

constexpr uint32_t kIdleMinNs = 256;
constexpr uint32_t kIdleMaxNs = 8192;  // the cap when SchedConfig leaves idle_max_ns at 0 (`--device-idle spin`)

// Leader, a turn with nothing to run: keep the heartbeat going, then end the drain, or park, or sleep.
// The backoff doubles up to idle_max_ns (the added latency for a request arriving soon after work), and
// to idle_deep_max_ns once idle for idle_deep_after_ns (issue 19: fewer wake-ups and PCIe reads). Parking
// (idle_park_after_ns) ends the kernel without `exited`: blink/device/idle.py relaunches it from the host
// on new work or a command, so an idle GPU runs no kernel at all. Never with followers or the self-test's
// relaunch-each-step variant.
BLINK_HD inline void idle_turn(const LoopParams& p) {
  SchedState* s = p.state;
  const SchedConfig& c = p.cfg;
  publish(s, c, p.rings);
  const uint64_t now = now_ns();
  if (s->idle_since_ns == 0) s->idle_since_ns = now;
  const int64_t idle_for = (int64_t)(now - s->idle_since_ns);
  const int base = c.idle_max_ns > 0 ? c.idle_max_ns : (int)kIdleMaxNs;
  const bool deep = c.idle_deep_after_ns > 0 && idle_for >= c.idle_deep_after_ns && c.idle_deep_max_ns > base;
  const int cap = deep ? c.idle_deep_max_ns : base;
  // Only once the backoff is at its longest: the first idle turns, where the next request's latency is
  // decided, read no extra host word.
  if (s->idle_ns >= base && drain_done(s, p.rings)) {
    s->stopping = 1;  // drained: every request the front end sent has finished
    return;
  }
  const bool hooked = p.hooks != nullptr && p.hooks->relaunch_each_step;
  if (c.idle_park_after_ns > 0 && idle_for >= c.idle_park_after_ns && p.peers == nullptr && !hooked &&
      s->running_count == 0 && s->waiting_count == 0) {
    s->parking = 1;
    s->parks++;
    return;
  }
  pause_ns((uint32_t)s->idle_ns);
  s->idle_ns = s->idle_ns * 2 > cap ? cap : s->idle_ns * 2;
}

// Leader, as a parked loop's kernel ends: the next instance starts a fresh idle period, shortest backoff.
BLINK_HD inline void park_done(SchedState* s) {
  s->parking = 0;
  s->idle_ns = kIdleMinNs;
  s->idle_since_ns = 0;
}

}  // namespace blink
