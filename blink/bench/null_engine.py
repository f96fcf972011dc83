"""An engine process that costs nothing, for measuring the front end alone:
`blink serve --engine-module blink.bench.null_engine [engine args]` serves the real front end, the real
rings and the real process model, but the engine answers at once. It polls ingress without sleeping (as
device mode's GPU does, every few microseconds; so it holds a core) and emits one token (id 0) per live
request per turn until each request's max_tokens. TTFT and ITL measured against it are the front end's
own cost plus the client's, with no model in the way.

`BLINK_NULL_STEP_MS=10` paces it like a real engine's decode steps: while requests are live, one turn (one
token a request) every 10 ms, so the front end reads one record a request at a time, as it does in serving;
arrivals wait for the next turn, and an idle engine starts an arrival at once.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from blink.core.limits import EngineLimits, publish_limits
from blink.entrypoints.engine_process import run_engine_process
from blink.model import presets
from blink.request import FinishReason, TokenEvent


def model_limits(args) -> EngineLimits:
    """The limits a real engine would publish for --model, from its config alone (a preset's, or the
    config.json of a model dir, which may hold only a tokenizer)."""
    if args.model in presets.PRESETS:
        cfg = presets.get(args.model)
        positions, vocab = cfg.max_position_embeddings, cfg.vocab_size
    else:
        raw = json.loads((Path(args.model) / "config.json").read_text())
        raw = raw.get("text_config", raw)
        positions, vocab = raw["max_position_embeddings"], raw["vocab_size"]
    # It computes no logits, so no prompt logprobs: the front end refuses them (400) rather than wait for none.
    return dataclasses.replace(EngineLimits.resolve(args, positions, vocab, num_kv_blocks=0), prompt_logprob_rows=0)


def serve(segment, args, should_stop) -> None:
    """run_engine_process's serve: of the engine args blink serve passes through, only the model (for the
    limits it publishes) and the limit flags count."""
    from blink.host.ring_loop import MAX_INGEST
    from blink.transport.rings import EgressProducer, IngressConsumer

    ingress, egress, ctl = IngressConsumer(segment), EgressProducer(segment), segment.control
    ctl.engine_mode = 1
    publish_limits(model_limits(args), ctl)
    ctl.ready = 1
    live: dict[int, list[int]] = {}  # req_id -> [tokens emitted, max_tokens]
    step_s = float(os.environ.get("BLINK_NULL_STEP_MS", "0")) / 1000
    next_turn = 0.0
    while not ctl.stop_flag and not should_stop():
        if live and step_s:  # a step is running: wait it out (sleeping, not spinning: the core is the client's too)
            time.sleep(max(0.0, next_turn - time.perf_counter()))
        next_turn = time.perf_counter() + step_s
        events: list[TokenEvent] = []
        for item in ingress.poll(MAX_INGEST):
            if item.kind == "abort":
                if live.pop(item.req_id, None) is not None:
                    events.append(TokenEvent(item.req_id, -1, 0, FinishReason.ABORT))
            else:
                live[item.req_id] = [0, item.params.max_tokens]
        for req_id, state in list(live.items()):
            state[0] += 1
            done = state[0] >= state[1]
            events.append(TokenEvent(req_id, 0, state[0] - 1, FinishReason.LENGTH if done else FinishReason.NONE))
            if done:
                del live[req_id]
        if events:
            egress.push(events)
            ctl.tokens += len(events)
            ctl.steps += 1
        ctl.running = len(live)
        ctl.heartbeat += 1
        if not events and not live and ctl.ingress_closed and not ingress.descriptors.used():
            break  # drained, as ring_loop: ingress closed (the flag read before the tail) and all served
    ctl.exited = 1


def main(argv: list[str] | None = None) -> int:
    return run_engine_process(argv, "blink null engine", serve)


if __name__ == "__main__":
    raise SystemExit(main())
