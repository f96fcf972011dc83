"""Structured outputs in device mode on a GPU: seeded constrained sampling (JSON schema, regex, choice;
temperature 0.8, two seeds per constraint as n=2 asks) gives the same tokens as host mode on the demo
model in fp32, through chunked prefill and preemption by recompute, and every output validates."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from tokenizers import Tokenizer

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.model.demo import ensure_default_model
from blink.request import Constraint, FinishReason, SamplingParams
from tests.grammar.test_host_structured import SCHEMAS, run, strict_json

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900), pytest.mark.usefixtures("no_tf32")]
REGEX = "[a-z]{3,8}@(x|y)\\.com"
CHOICES = ["alpha", "beta", "gamma delta"]


def constraints() -> list[Constraint]:
    return ([Constraint("json_schema", json.dumps(s)) for s in SCHEMAS] + [Constraint("regex", REGEX),
            Constraint("choice", json.dumps(CHOICES))])


def requests(prompt_len: int) -> dict:
    out = {}
    for i, c in enumerate(constraints()):
        for j in range(2):  # n=2: two samples of one constraint, each with its own seed
            prompt = [3 + (k * 7 + i) % 200 for k in range(prompt_len)]
            out[10 * i + j] = (prompt, SamplingParams(temperature=0.8, seed=100 * i + j, max_tokens=150, constraint=c))
    out[99] = ([5, 6, 7], SamplingParams(temperature=0.8, seed=7, max_tokens=20))  # an unconstrained neighbour
    return out


def check_valid(tokens: dict, reasons: dict, eos: tuple[int, ...]) -> None:
    demo = Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    kinds = constraints()
    for rid, ids in tokens.items():
        if rid == 99:
            continue
        assert reasons[rid] == FinishReason.STOP, rid
        text = demo.decode([t for t in ids if t not in eos])
        c = kinds[rid // 10]
        if c.kind == "json_schema":
            jsonschema.validate(strict_json(text), SCHEMAS[rid // 10])
        elif c.kind == "regex":
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in CHOICES, text


@pytest.mark.parametrize("num_kv_blocks", [256, 56], ids=["roomy", "preempting"])
def test_device_mode_constrained_sampling_equals_host_mode(num_kv_blocks):
    args = EngineArgs(device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=32, block_size=4,
                      num_kv_blocks=num_kv_blocks, max_model_len=256, grammar_arena_mb=8,
                      enable_prefix_caching=num_kv_blocks != 56)  # a cache would spare the pool (H200)
    loaded = LoadedModel.load(args)
    work = requests(prompt_len=40)  # longer than the token budget: chunked prefill
    host = HostEngine(args, loaded)
    ref_tokens, ref_reasons = run(host, work)
    host.shutdown()
    del host
    check_valid(ref_tokens, ref_reasons, loaded.eos_token_ids)
    dev = DeviceEngine(args, loaded)
    try:
        tokens, reasons = run(dev, work)
        assert tokens == ref_tokens and reasons == ref_reasons
        if num_kv_blocks == 56:
            assert dev.stats().preemptions > 0, "the pool should force preemption by recompute"
        assert dev.segment.control.error_code == 0
        assert dev.constraints.staging.held_keys() == set(), "every slot free once every last record was read"
    finally:
        dev.shutdown()
