"""--rank-cpus: each tensor-parallel rank process runs on its own cores, and the flag survives the engine
process's command line."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from blink.config import EngineArgs
from blink.entrypoints.engine_factory import make_engine
from blink.parallel.pinning import parse_rank_cpus
from blink.request import SamplingParams
from blink.util.cpus import parse_cpu_list, pin_process

pytestmark = pytest.mark.slow  # spawns processes


def _cpus_allowed(pid: int, tid: int | None = None) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status").read_text()
    return next(line.split(":")[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


def test_rank_cpus_round_trip_through_the_cli():
    args = EngineArgs(model="tiny-llama", tensor_parallel_size=2, rank_cpus="0-3;4,6", num_layers=1)
    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    assert EngineArgs.from_cli(p.parse_args(args.to_cli())) == args


def test_rank_cpu_lists_are_parsed_and_checked():
    assert parse_cpu_list("0-2,5") == [0, 1, 2, 5]
    assert parse_rank_cpus(None, 2) is None
    assert parse_rank_cpus("0;1-2", 2, check_available=False) == [[0], [1, 2]]
    with pytest.raises(ValueError, match="gives 1 CPU lists for 2 tensor-parallel ranks"):
        parse_rank_cpus("0", 2)
    with pytest.raises(ValueError, match="bad CPU range '3-1'"):
        parse_rank_cpus("0;3-1", 2)
    with pytest.raises(ValueError, match="rank 1's CPUs \\[100000\\] are not available"):
        parse_rank_cpus("0;100000", 2)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_each_rank_runs_on_its_own_cpus():
    first, second = sorted(os.sched_getaffinity(0))[:2]
    before = os.sched_getaffinity(0)
    args = EngineArgs(model="tiny-llama", device="cpu", engine="host", tensor_parallel_size=2, num_kv_blocks=8,
                      block_size=4, max_num_seqs=2, rank_cpus=f"{first};{second}")
    engine = make_engine(args)
    try:
        engine.add_request(1, [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()  # the ranks work (and start their thread pools) while pinned
        assert _cpus_allowed(os.getpid()) == str(first)
        worker = engine.tp.workers.processes[0].pid
        threads = os.listdir(f"/proc/{worker}/task")
        assert {_cpus_allowed(worker, int(t)) for t in threads} == {str(second)}
    finally:
        engine.shutdown()
        pin_process(before)  # this test process was rank 0
    assert os.sched_getaffinity(0) == before
