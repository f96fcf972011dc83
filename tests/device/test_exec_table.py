"""Device mode's exec table (device_graphs.capture_device_graphs) against the index the GPU loop launches
(csrc/sched_variant.h's graph_exec_index, through the host build): each (bucket, variant, parity) finds its own
graph's exec, a bucket with no searchless graph finds its full one, and every exec is instantiated once."""
from __future__ import annotations

import ctypes as C

import pytest

from blink.device import structs
from blink.device.build import load_host_library
from blink.device.device_graphs import capture_device_graphs

BUCKETS = [(1, 1), (2, 2), (4, 4), (8, 4), (16, 4)]


class Graph:
    made: dict[int, tuple] = {}  # raw handle -> (bucket index, buffer set, search)

    def __init__(self, key):
        self.raw = 1000 + len(Graph.made)
        Graph.made[self.raw] = key

    def raw_cuda_graph(self) -> int:
        return self.raw


class Runner:
    buckets = BUCKETS

    def __init__(self):
        self.captured = []

    def capture(self, bucket, buffers, on_graph_end=None, search: bool = True):
        self.captured.append((bucket, buffers, search))
        return Graph((BUCKETS.index(bucket), buffers, search))


class Lib:
    """Instantiation hands back the graph's own key as its exec, so the table says which graph each slot holds."""

    def __init__(self):
        self.keys = {}

    def blink_instantiate_device(self, raw, stream, exec_ref) -> int:
        exec_ref._obj.value = len(self.keys) + 1
        self.keys[exec_ref._obj.value] = Graph.made[raw.value]
        return 0


@pytest.mark.parametrize("searchless", [False, True])
def test_the_table_matches_the_loops_index(searchless):
    Graph.made.clear()
    lib, runner, graphs, execs = Lib(), Runner(), {}, []
    table = capture_device_graphs(lib, runner, [0, 1], None, 0, graphs, execs, searchless=searchless)
    decode = [b for b, (t, s) in enumerate(BUCKETS) if t == s]
    assert len(execs) == len(set(execs)) == 2 * (len(BUCKETS) + (len(decode) if searchless else 0))
    variants = 2 if searchless else 1
    assert len(table) == variants * len(BUCKETS) * 2
    cfg = structs.SchedConfig(num_buckets=len(BUCKETS), sampler_variants=variants)
    host = load_host_library()
    for b in range(len(BUCKETS)):
        for variant in range(variants):
            for parity in (0, 1):
                exec_ = table[host.blink_graph_exec_index(C.byref(cfg), b, variant, parity)]
                searched = variant == 0 or b not in decode  # a bucket with no searchless graph: its full one
                assert lib.keys[exec_] == (b, parity, searched), (b, variant, parity)
    assert runner.captured[0][0] == BUCKETS[-1], "largest first: the rest reuse its pool"
