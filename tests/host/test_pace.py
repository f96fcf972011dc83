"""Host mode's decode pace (issue 19, energy; blink/host/pace.py): the flag, which steps wait and what ends a wait.
Time bounds guard against stalls or a pace that is ignored; they do not time the engine."""
from __future__ import annotations

import argparse
import time

import pytest

from blink.config import EngineArgs
from blink.host.pace import DecodePace
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model
from tests.host.test_host_engine import engine, run_all

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_the_flag_takes_milliseconds_and_names_itself_when_wrong():
    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    assert EngineArgs.from_cli(p.parse_args([])).decode_pace_ms == 0.0
    assert EngineArgs.from_cli(p.parse_args(["--decode-pace-ms", "12.5"])).decode_pace_ms == 12.5
    for bad in ("-1", "abc", "1001", "nan"):
        with pytest.raises(SystemExit):
            p.parse_args(["--decode-pace-ms", bad])
    cli = EngineArgs(decode_pace_ms=7.0).to_cli()
    assert cli[cli.index("--decode-pace-ms") + 1] == "7.0"
    args = p.parse_args(["--decode-pace-ms", "8", "--decode-pace-max-batch", "16"])
    assert EngineArgs.from_cli(args).decode_pace_max_batch == 16
    for bad in ("-1", "2.5", "x"):
        with pytest.raises(SystemExit):
            p.parse_args(["--decode-pace-max-batch", bad])
    with pytest.raises(ValueError, match="--decode-pace-max-batch needs --decode-pace-ms"):
        EngineArgs(decode_pace_max_batch=4)
    cli = EngineArgs(decode_pace_ms=5.0, decode_pace_max_batch=4).to_cli()
    assert cli[cli.index("--decode-pace-max-batch") + 1] == "4"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


def test_paced_decodes_give_the_same_tokens_no_faster_than_the_pace(tiny):
    requests = {1: ([5, 9, 13], GREEDY), 2: ([7, 8], GREEDY)}
    plain, _, plain_plans = run_all(engine(tiny), requests)
    t0 = time.perf_counter()
    paced, _, paced_plans = run_all(engine(tiny, decode_pace_ms=40), requests)
    took = time.perf_counter() - t0
    assert paced == plain and paced_plans == plain_plans
    # 8 tokens each: the prefill step, then 7 paced decode steps
    assert took >= 7 * 0.040 * 0.9


class Seq:
    def __init__(self, is_decode: bool):
        self.is_decode = is_decode


def test_only_decodes_wait_and_a_queue_ends_the_wait():
    pace = DecodePace(50)
    decoding = [Seq(True), Seq(True)]
    assert pace.wait_s(0.0, waiting=0, running=decoding) == 0.0, "no step yet"
    pace.last_start = 10.0
    assert pace.wait_s(10.02, waiting=0, running=decoding) == pytest.approx(0.03)
    assert pace.wait_s(10.02, waiting=1, running=decoding) == 0.0, "a waiting request is planned now"
    assert pace.wait_s(10.02, waiting=0, running=[]) == 0.0
    assert pace.wait_s(10.06, waiting=0, running=decoding) == 0.0, "the pace is over"
    assert pace.wait_s(10.02, waiting=0, running=[Seq(True), Seq(False)]) == 0.0, "a prompt is left to prefill"
    assert DecodePace(0).wait_s(0.0, 0, decoding) == 0.0


def test_a_max_batch_holds_small_batches_only():
    pace = DecodePace(50, max_batch=2)
    pace.last_start = 10.0
    assert pace.wait_s(10.02, 0, [Seq(True)] * 2) == pytest.approx(0.03), "at the max batch: held"
    assert pace.wait_s(10.02, 0, [Seq(True)] * 3) == 0.0, "above it: full speed"


def test_a_paced_engine_takes_a_new_request_at_once(tiny):
    eng = engine(tiny, decode_pace_ms=1000)
    eng.add_request(1, [5, 9, 13], GREEDY)
    assert [ev.req_id for ev in eng.step()] == [1], "the prefill and its first token"
    t0 = time.perf_counter()
    assert eng.step() == [] and time.perf_counter() - t0 < 0.5, "the decode waits, a slice at a time"
    assert eng.paced and eng.stats().steps == 1, "a slice of the wait is not a step (the ring loop's intervals)"
    eng.add_request(2, [7, 8], GREEDY)
    events = eng.step()
    assert time.perf_counter() - t0 < 0.5
    assert {ev.req_id for ev in events} == {1, 2}, "the arrival's prefill and the decode ran together"
    assert not eng.paced and eng.stats().steps == 2
