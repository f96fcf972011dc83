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


def test_rounds_rotate_the_modes_and_take_the_median():
    """--rounds: each mode leads one round in turn (the first timed tends to be slower), and a row is the median
    of its rounds with their range."""
    modes = ["greedy", "greedy-search", "top_p"]
    assert [step.round_order(modes, r)[0] for r in range(4)] == ["greedy", "greedy-search", "top_p", "greedy"]
    assert all(sorted(step.round_order(modes, r)) == sorted(modes) for r in range(3))
    assert step.spread([5.3, 5.1, 5.2]) == (5.2, 5.1, 5.3)
    assert step.spread([4.0, 6.0, 5.0, 7.0]) == (5.0, 4.0, 7.0)
    assert step.spread([1.5]) == (1.5, 1.5, 1.5)


def test_decode_rows_over_rounds_on_the_cpu(monkeypatch):
    """time_step end to end with its graphs stubbed (a tiny preset on the CPU): each mode replays the graph the
    engine would (greedy: the searchless one where captured; "-search": the full one), rounds rotate the modes,
    and a row carries its median and every round."""
    from dataclasses import replace

    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    real_load, real_for_model = LoadedModel.load, ModelRunner.for_model
    monkeypatch.setattr(LoadedModel, "load", classmethod(
        lambda cls, args, num_layers=None: real_load(replace(args, device="cpu", dtype="float32"), num_layers)))

    class Graph:
        def __init__(self, name):
            self.name = name

    def for_model(loaded, use_graphs=None):
        runner = real_for_model(loaded, use_graphs=False)
        runner.graphs = {b: Graph(f"full {b[0]}") for b in runner.buckets}
        runner.searchless_graphs = {b: Graph(f"searchless {b[0]}") for b in runner.buckets if b[0] == b[1]}
        return runner

    monkeypatch.setattr(ModelRunner, "for_model", staticmethod(for_model))
    replays = []
    monkeypatch.setattr(step, "graph_replay_ms", lambda graph, iters: replays.append(graph.name) or len(replays))
    rows = step.time_step("tiny-llama", [1, 2], 16, 3, None, ["greedy", "greedy-search"], block_size=16, rounds=3)
    assert replays == ["searchless 1", "searchless 2", "full 1", "full 2",  # round 1: greedy first
                       "full 1", "full 2", "searchless 1", "searchless 2",  # round 2: rotated
                       "searchless 1", "searchless 2", "full 1", "full 2"]
    got = {(r["sampling"], r["batch"]): (r["search"], r["ms_rounds"], r["ms"]) for r in rows}
    assert got[("greedy", 1)] == (False, [1, 7, 9], 7) and got[("greedy-search", 2)] == (True, [4, 6, 12], 6)
