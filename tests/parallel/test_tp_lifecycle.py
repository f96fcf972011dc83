"""TP set-up and tear-down: refusals, a crashed worker, clean shutdown, and `blink generate -tp 2`."""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blink.config import EngineArgs
from blink.entrypoints.engine_factory import make_engine
from blink.parallel.host_tp import wait_or_fail
from blink.parallel.ranks import TensorParallelError
from blink.request import SamplingParams
from tests.hf_models import make_tiny_model

pytestmark = pytest.mark.slow  # spawns processes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tp"), "llama")


def _args(path, tp=2, **kw):
    return EngineArgs(model=str(path), device="cpu", engine="host", tensor_parallel_size=tp, num_kv_blocks=16,
                      block_size=4, max_num_seqs=4, max_num_batched_tokens=16, **kw)


def test_tp_size_that_does_not_divide_the_heads_is_refused_before_any_worker(tiny_llama):
    with pytest.raises(ValueError, match="--tensor-parallel-size 3 does not divide the model's 4 attention heads"):
        make_engine(_args(tiny_llama, tp=3))
    assert multiprocessing.active_children() == []


def test_p2p_all_reduce_on_the_cpu_is_refused_before_any_worker(tiny_llama):
    with pytest.raises(ValueError, match="--all-reduce p2p needs CUDA GPUs"):
        make_engine(_args(tiny_llama, all_reduce="p2p"))
    assert multiprocessing.active_children() == []


def test_device_mode_tp_without_enough_gpus_is_refused_before_any_worker(tiny_llama):
    args = EngineArgs(model=str(tiny_llama), device="cuda", engine="device", tensor_parallel_size=2)
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(ValueError, match="--tensor-parallel-size 2 needs 2 GPUs"):
        make_engine(args)
    assert multiprocessing.active_children() == []


def test_crashed_worker_gives_one_line_error_and_no_orphan(tiny_llama):
    engine = make_engine(_args(tiny_llama))
    workers = engine.tp.workers.processes
    try:
        engine.add_request(1, [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
        assert len(engine.step()) == 1  # the prompt's step runs on both ranks
        os.kill(workers[0].pid, signal.SIGKILL)
        with pytest.raises(TensorParallelError) as err:
            for _ in range(4):
                engine.step()
        assert "tensor-parallel rank 1 died (exit code -9)" in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        engine.shutdown()
    assert not any(p.is_alive() for p in workers)


def test_dropping_the_engine_stops_the_workers(tiny_llama):
    engine = make_engine(_args(tiny_llama))  # nobody calls shutdown(), as with a dropped LLM
    workers = engine.tp.workers.processes
    del engine
    gc.collect()
    assert [p.exitcode for p in workers] == [0]


def _generate_cli(path, tp: int) -> list[dict]:
    cmd = [sys.executable, "-m", "blink", "generate", "--model", str(path), "--device", "cpu",
           "--tensor-parallel-size", str(tp), "--prompt", "hello world", "--prompt-ids", "5,6,7,8",
           "--max-tokens", "6", "--ignore-eos", "--json", "--num-kv-blocks", "32"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_blink_generate_tp2_end_to_end(tiny_llama):
    got = _generate_cli(tiny_llama, 2)
    assert len(got) == 2 and all(len(o["token_ids"]) == 6 for o in got)
    assert got == _generate_cli(tiny_llama, 1)


_HOLD_ENGINE = """
import sys, time
from blink.config import EngineArgs
from blink.entrypoints.engine_factory import make_engine

engine = make_engine(EngineArgs(model=sys.argv[1], device="cpu", engine="host", tensor_parallel_size=2,
                               num_kv_blocks=8))
print(engine.tp.workers.processes[0].pid, flush=True)
time.sleep(120)
"""


def test_workers_die_with_a_killed_rank0(tiny_llama):
    rank0 = subprocess.Popen([sys.executable, "-c", _HOLD_ENGINE, str(tiny_llama)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(rank0.stdout.readline())
    finally:
        rank0.kill()
        rank0.wait()
    for _ in range(100):  # PR_SET_PDEATHSIG delivers SIGKILL to the orphan at once; allow it 10 s
        if not _alive(worker_pid):
            break
        time.sleep(0.1)
    assert not _alive(worker_pid)
    # The step queue's file went as soon as the worker attached it: a killed rank 0 leaves nothing behind.
    assert not list(Path("/dev/shm").glob(f"blink-tp-{rank0.pid}-*"))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_wait_or_fail_returns_once_done_without_needless_checks():
    polls, checks = iter([False, False, True]), []
    wait_or_fail(lambda: next(polls), lambda: checks.append(1), every_s=60.0)
    assert checks == []  # done long before the first liveness check was due


def test_wait_or_fail_raises_what_the_liveness_check_reports():
    """A step that never completes (a dead worker's peers wait inside the collective) ends in its error."""
    dead = TensorParallelError("tensor-parallel rank 1 died (exit code -9)")
    answers = iter([None, None, dead])
    with pytest.raises(TensorParallelError, match="rank 1 died"):
        wait_or_fail(lambda: False, lambda: next(answers), every_s=0.0)
