"""The offline bench's split of a run's steps by kind (blink/bench/step_split.py): on made-up steps, and on a tiny
host engine's real steps (CPU)."""
import itertools

import pytest

from blink.bench.drive import run_greedy
from blink.bench.roofline import ModelShape
from blink.bench.step_split import format_split, last_run_steps, split_steps, step_floor_s
from blink.config import EngineArgs
from blink.core.interface import StepTime
from blink.model import presets
from blink.model.config import ModelConfig

SHAPE = ModelShape.of(ModelConfig.from_hf_dict(presets.PRESETS["llama3-8b"]))


def test_steps_split_by_kind_with_their_floors():
    steps = [StepTime(0.050, 2048, 8), StepTime(0.040, 1000, 40), StepTime(0.005, 64, 64), StepTime(0.006, 64, 64),
             StepTime(0.004, 32, 32)]
    prefill, decode = split_steps(steps, SHAPE, 256, 128)
    assert (prefill.kind, prefill.steps, decode.kind, decode.steps) == ("prefill", 2, "decode", 3)
    assert prefill.seconds == pytest.approx(0.090) and decode.seconds == pytest.approx(0.015)
    assert decode.median_ms == pytest.approx(5.0)
    assert decode.floor_s == pytest.approx(2 * SHAPE.decode_floor_s(64, 320) + SHAPE.decode_floor_s(32, 320))
    assert prefill.floor_s == pytest.approx(step_floor_s(steps[0], SHAPE, 256, 128)
                                            + SHAPE.step_floor_s(1000, 500, 1000 * 257 // 2))
    assert prefill.ratio == pytest.approx(0.090 / prefill.floor_s)
    text = format_split([prefill, decode], wall_s=0.120)
    assert "prefill" in text and "decode" in text and "105.0 of the run's 120.0 ms" in text


def test_a_run_of_decodes_only_has_one_kind_and_the_slice_takes_the_last_steps():
    steps = [StepTime(0.001 * i, 8, 8) for i in range(1, 6)]
    assert [k.kind for k in split_steps(steps, SHAPE, 16, 16)] == ["decode"]
    assert last_run_steps(steps, 2) == steps[-2:] and last_run_steps(steps, 0) == []


def test_a_host_engine_run_splits_into_its_prefill_and_decode_steps(tmp_path):
    from blink.host.engine import HostEngine
    from tests.hf_models import make_tiny_model

    path = make_tiny_model(tmp_path, "llama")
    engine = HostEngine(EngineArgs(model=str(path), device="cpu", dtype="float32", max_num_seqs=4,
                                   max_num_batched_tokens=16, num_kv_blocks=64, block_size=4))
    ids = itertools.count(1)
    run_greedy(engine, [[5, 6, 7]], 2, ids, timeout_s=60)  # a warm-up whose steps the slice must leave out
    before = engine.stats().steps
    prompts = [list(range(10, 30)), list(range(40, 52)), [3, 4]]  # 34 prompt tokens: 3+ chunks of 16
    wall, tokens = run_greedy(engine, prompts, 6, ids, timeout_s=60)
    steps = last_run_steps(engine.step_times(), engine.stats().steps - before)
    assert tokens == 18 and len(steps) == engine.stats().steps - before
    kinds = {k.kind: k for k in split_steps(steps, SHAPE, 12, 6)}  # the kinds are under test here, not the floors
    assert set(kinds) == {"prefill", "decode"}
    assert kinds["prefill"].steps >= 3  # 34 tokens do not fit two 16-token steps
    assert kinds["prefill"].steps + kinds["decode"].steps == len(steps)
    assert sum(k.seconds for k in kinds.values()) <= wall
