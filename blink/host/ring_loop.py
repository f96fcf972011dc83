"""Host mode's engine process loop: read the ingress ring, step the engine, write the egress ring.

This is the conventional design's per-token CPU path: every step passes through this Python loop.
"""
from __future__ import annotations

import time

from blink.core.interface import Engine
from blink.core.limits import publish_limits
from blink.request import FinishReason, TokenEvent
from blink.transport.commands import apply_prefix_cache_reset
from blink.transport.layout import step_interval_bucket

MAX_INGEST = 256  # descriptors taken per loop turn
IDLE_SLEEP_MAX = 1e-3


def publish_stats(engine: Engine, ctl) -> None:
    s = engine.stats()
    ctl.running, ctl.waiting = s.running, s.waiting
    ctl.free_kv_blocks, ctl.total_kv_blocks = s.free_kv_blocks, s.total_kv_blocks
    ctl.steps, ctl.tokens, ctl.preemptions = s.steps, s.tokens, s.preemptions
    for bucket, count in enumerate(s.iteration_tokens):
        ctl.iteration_tokens[bucket] = count
    ctl.iteration_tokens_sum = s.iteration_tokens_sum
    ctl.prefix_cache_queries, ctl.prefix_cache_hits = s.prefix_cache_queries, s.prefix_cache_hits
    ctl.heartbeat += 1


def observe_step_interval(ctl, busy_since: int) -> int:
    """A step just ended: count its busy interval (from the last one's end, if no idle turn came between) in
    ControlBlock.step_intervals, as the GPU scheduler does; returns the new reference."""
    now = time.perf_counter_ns()
    if busy_since:
        ctl.step_intervals[step_interval_bucket(now - busy_since)] += 1
        ctl.step_intervals_sum_ns += now - busy_since
    return now


def serve_rings(engine: Engine, segment, should_stop=lambda: False) -> None:
    from blink.transport.rings import EgressProducer, IngressConsumer

    ingress, egress, ctl = IngressConsumer(segment), EgressProducer(segment), segment.control
    ctl.engine_mode = 1
    publish_limits(engine.limits, ctl)
    if hasattr(engine, "publish_model_info"):  # the banner's dtype and graph mode
        engine.publish_model_info(ctl)
    publish_stats(engine, ctl)
    ctl.ready = 1
    idle = 0.0
    busy_since = 0  # perf_counter_ns at the last step's end; 0 after an idle turn (its interval is not busy)
    while not ctl.stop_flag and not should_stop():
        events: list[TokenEvent] = []
        apply_prefix_cache_reset(ctl, engine.reset_prefix_cache)  # between steps, as the GPU loop
        for item in ingress.poll(MAX_INGEST):
            if item.kind == "abort":
                engine.abort_request(item.req_id)
                continue
            try:
                engine.add_request(item.req_id, item.prompt_ids, item.params)
            except ValueError:
                # The front end validates first, so this is a descriptor it could not judge: refuse it.
                events.append(TokenEvent(item.req_id, -1, 0, FinishReason.ERROR))
        if engine.has_unfinished():
            events += engine.step()
            if not engine.paced:  # a slice of a paced wait is not a step (host/pace.py)
                busy_since = observe_step_interval(ctl, busy_since)
            idle = 0.0
        elif not events:
            # The drain is over once the front end closed ingress (after its last descriptor: the
            # flag is read first, the tail second) and everything it sent has finished.
            if ctl.ingress_closed and not ingress.descriptors.used():
                break
            busy_since = 0
            idle = min(IDLE_SLEEP_MAX, idle * 2 or 20e-6)  # back off, never burn a core while idle
            time.sleep(idle)
        if events:
            egress.push(events)
        publish_stats(engine, ctl)
    ctl.exited = 1
