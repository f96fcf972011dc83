"""A stand-in engine process for front-end tests: serves the rings without a model.

`python -m tests.frontend.fake_engine --shm NAME [engine args, ignored]`. Each step, every running request
emits one token: output token i is prompt token i (mod prompt length), so outputs are predictable. A
token in stop_token_ids ends the request with STOP; max_tokens with LENGTH; an abort with ABORT (-1).
Logprobs: the chosen token gets -0.5, the top-k list is the next k prompt tokens at -1, -2, ...
Every first record reports FAKE_QUEUE_US of engine queue time.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from blink.config import EngineArgs
from blink.core.limits import EngineLimits, publish_limits
from blink.request import FinishReason, TokenEvent
from blink.transport.rings import EgressProducer, IngressConsumer
from blink.transport.shm import Segment
from blink.util.startup import phase

STEP_S = float(os.environ.get("FAKE_ENGINE_STEP_S", "0.002"))
START_S = float(os.environ.get("FAKE_ENGINE_START_S", "0"))  # a slow start (after one phase line)
FAKE_QUEUE_US = 1500  # every request's first record says it queued 1.5 ms (the metrics test checks it)


def step(running: dict, item_of: dict) -> list[TokenEvent]:
    events = []
    for req_id in list(running):
        prompt, params, position = item_of[req_id]
        token = prompt[position % len(prompt)]
        event = TokenEvent(req_id, token, position, queue_us=FAKE_QUEUE_US if position == 0 else 0)
        if params.logprobs is not None:
            event.logprob = -0.5
            k = params.logprobs
            event.top_ids = [prompt[(position + 1 + j) % len(prompt)] for j in range(k)]
            event.top_logprobs = [-1.0 - j for j in range(k)]
        if token in params.stop_token_ids and position + 1 >= params.min_tokens:
            event.finish_reason = FinishReason.STOP
        elif position + 1 >= params.max_tokens:
            event.finish_reason = FinishReason.LENGTH
        events.append(event)
        if event.finished:
            del running[req_id]
        else:
            item_of[req_id] = (prompt, params, position + 1)
    return events


def fake_limits(args) -> EngineLimits:
    """What a real engine would publish for the model dir's config.json (no model is loaded)."""
    config = json.loads((Path(args.model) / "config.json").read_text()) if args.model else {}
    # It computes no logits: no prompt-logprob rows, so the front end refuses prompt logprobs (400).
    engine_args = EngineArgs(model=args.model, max_model_len=args.max_model_len, max_prompt_logprob_rows=0)
    return EngineLimits.resolve(engine_args, config.get("max_position_embeddings", 256),
                                config.get("vocab_size", 256), num_kv_blocks=100)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shm", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    args, _ = parser.parse_known_args()
    if args.model and args.model.endswith("missing-model"):
        raise SystemExit("fake engine: error: no such model")  # lets tests exercise a failed start
    if START_S:
        phase("engine", "fake model built")
        time.sleep(START_S)
    segment = Segment.attach(args.shm)
    control = segment.control
    ingress, egress = IngressConsumer(segment), EgressProducer(segment)
    control.engine_mode = 1
    control.total_kv_blocks = control.free_kv_blocks = 100
    publish_limits(fake_limits(args), control)
    control.ready = 1
    running: dict[int, bool] = {}
    item_of: dict[int, tuple] = {}
    while not control.stop_flag:
        control.heartbeat += 1
        events = []
        for item in ingress.wait(0.0 if running else 0.01):
            if item.kind == "request":
                running[item.req_id] = True
                item_of[item.req_id] = (item.prompt_ids, item.params, 0)
            elif running.pop(item.req_id, None):
                events.append(TokenEvent(item.req_id, -1, -1, FinishReason.ABORT))
        events += step(running, item_of)
        egress.push(events)
        control.tokens += sum(e.token_id >= 0 for e in events)
        control.running = len(running)
        control.free_kv_blocks = 100 - len(running)
        if running:
            control.steps += 1
            time.sleep(STEP_S)
        elif control.ingress_closed and not ingress.descriptors.used():
            break  # drained, as the real engines: ingress closed (flag read first) and all served
    control.exited = 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
