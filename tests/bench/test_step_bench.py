"""`blink bench step`'s prefill rows end to end on the CPU (a tiny preset, eager, CUDA events stubbed): the KV block
size reaches the engine, the plan and the rows (--block-size, for the warp-specialised prefill's 128-token blocks)."""
import pytest
import torch

from blink.bench import step


class _Event:
    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


@pytest.mark.parametrize("block_size", [16, 128])
def test_prefill_rows_at_a_block_size(monkeypatch, block_size):
    monkeypatch.setattr(step, "DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    seen = []
    real_plan = step.chunks_plan
    monkeypatch.setattr(step, "chunks_plan", lambda chunks, size: seen.append(size) or real_plan(chunks, size))
    rows = step.time_prefill("tiny-llama", [(40, 0), (24, 50)], iters=3, layers=None, block_size=block_size)
    assert seen == [block_size, block_size]
    assert [(r["prefill_tokens"], r["context"], r["block_size"], r["graph"]) for r in rows] == [
        (40, 0, block_size, False), (24, 50, block_size, False)]
    assert all(r["ms"] == 1.0 and r["ratio"] > 0 for r in rows)  # the stub's 1 ms over a floor


def test_the_flag_defaults_to_the_engine_block_size():
    import argparse

    from blink.config import EngineArgs

    parser = argparse.ArgumentParser()
    step.add_parser(parser.add_subparsers(dest="cmd"))
    assert parser.parse_args(["step"]).block_size == EngineArgs.block_size
    assert parser.parse_args(["step", "--block-size", "128"]).block_size == 128


def test_sampling_modes_with_the_search_forced():
    """--sampling's "-search" suffix: the rows' graph with the sampler's search whatever they need (a plain mode
    runs what the engine would); unknown modes refused by name."""
    params, forced = step.mode_params("greedy-search")
    assert params is step.SAMPLING_MODES["greedy"] and forced
    assert step.mode_params("top_p") == (step.SAMPLING_MODES["top_p"], False)
    assert step.mode_params("greedy") == (step.SAMPLING_MODES["greedy"], False)
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        step.mode_params("beam")
    with pytest.raises(ValueError, match="unknown mode 'greedy-nosearch'"):
        step.mode_params("greedy-nosearch")
