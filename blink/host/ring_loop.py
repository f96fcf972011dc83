"""Host mode's engine process loop: read the ingress ring, step the engine, write the egress ring.

This is the conventional design's per-token CPU path: every step passes through this Python loop.
"""
from __future__ import annotations

import time

from blink.core.interface import Engine
from blink.core.limits import publish_limits
from blink.request import FinishReason, TokenEvent

MAX_INGEST = 256  # descriptors taken per loop turn
IDLE_SLEEP_MAX = 1e-3


def publish_stats(engine: Engine, ctl) -> None:
    s = engine.stats()
    ctl.running, ctl.waiting = s.running, s.waiting
    ctl.free_kv_blocks, ctl.total_kv_blocks = s.free_kv_blocks, s.total_kv_blocks
    ctl.steps, ctl.tokens, ctl.preemptions = s.steps, s.tokens, s.preemptions
    ctl.heartbeat += 1


def serve_rings(engine: Engine, segment, should_stop=lambda: False) -> None:
    from blink.transport.rings import EgressProducer, IngressConsumer

    ingress, egress, ctl = IngressConsumer(segment), EgressProducer(segment), segment.control
    ctl.engine_mode = 1
    publish_limits(engine.limits, ctl)
    publish_stats(engine, ctl)
    ctl.ready = 1
    idle = 0.0
    while not ctl.stop_flag and not should_stop():
        events: list[TokenEvent] = []
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
            idle = 0.0
        elif not events:
            # The drain is over once the front end closed ingress (after its last descriptor: the
            # flag is read first, the tail second) and everything it sent has finished.
            if ctl.ingress_closed and not ingress.descriptors.used():
                break
            idle = min(IDLE_SLEEP_MAX, idle * 2 or 20e-6)  # back off, never burn a core while idle
            time.sleep(idle)
        if events:
            egress.push(events)
        publish_stats(engine, ctl)
    ctl.exited = 1
