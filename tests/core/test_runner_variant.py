"""Host mode's choice of graph (ModelRunner.needs_search / run): a step replays its bucket's searchless graph only
when no row that samples needs the sampler's search, and only where that graph was captured."""
from __future__ import annotations

from blink.core.outputs import ScheduledChunk, SchedulerOutput
from blink.core.runner import ModelRunner
from blink.core.sequence import Sequence
from blink.request import SamplingParams


def chunk(params: SamplingParams, prompt_len: int = 4, start: int = 0, num_tokens: int = 4) -> ScheduledChunk:
    return ScheduledChunk(Sequence(1, list(range(2, 2 + prompt_len)), params, seed=1, arrival=0), start, num_tokens)


def test_the_rows_that_sample_decide():
    plain, top_p = SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, top_p=0.9)
    assert not ModelRunner.needs_search(SchedulerOutput([chunk(plain), chunk(SamplingParams())], []))
    assert ModelRunner.needs_search(SchedulerOutput([chunk(plain), chunk(top_p)], []))
    assert ModelRunner.needs_search(SchedulerOutput([chunk(SamplingParams(logprobs=2))], []))
    # a prompt chunk mid-prefill samples the scratch slot: its filter does not matter
    mid = chunk(top_p, prompt_len=8, num_tokens=4)
    assert not mid.samples and not ModelRunner.needs_search(SchedulerOutput([chunk(plain), mid], []))


class Graph:
    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def replay(self) -> None:
        self.log.append(self.name)


def test_run_replays_the_searchless_graph_where_one_was_captured():
    log: list[str] = []
    runner = ModelRunner.__new__(ModelRunner)  # the graphs only: no model is needed to pick one
    runner.graphs = {(1, 1): Graph("full 1", log), (8, 8): Graph("full 8", log), (16, 8): Graph("full 16", log)}
    runner.searchless_graphs = {(1, 1): Graph("searchless 1", log), (8, 8): Graph("searchless 8", log)}
    for bucket, search in [((1, 1), False), ((1, 1), True), ((8, 8), False), ((16, 8), False), ((8, 8), True)]:
        runner.run(bucket, search)
    assert log == ["searchless 1", "full 1", "searchless 8", "full 16", "full 8"]
