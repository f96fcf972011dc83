"""A dead tensor-parallel rank is reported at once, not after the step timeout: Workers.dead() sees an ended
worker process without waiting, and device mode's check raises it as a one-line error."""
from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

import pytest

from blink.device.engine import check_followers
from blink.parallel.ranks import Workers

pytestmark = pytest.mark.slow  # spawns processes


def _workers(*processes) -> Workers:
    w = Workers.__new__(Workers)  # the real class around stand-in processes: no model to load
    w.processes, w.conns = list(processes), []
    return w


def _exit_with(code: int) -> None:
    raise SystemExit(code)


def test_dead_names_the_first_ended_rank_and_its_exit_code():
    ctx = multiprocessing.get_context("spawn")
    ended = ctx.Process(target=_exit_with, args=(3,))
    ended.start()
    ended.join(30)
    running = SimpleNamespace(exitcode=None)
    assert _workers(running, running).dead() is None
    err = _workers(running, ended).dead()
    assert str(err) == "tensor-parallel rank 2 died (exit code 3)"


def test_device_mode_raises_it_as_one_line():
    check_followers(None)  # no tensor parallelism: nothing to check
    alive = SimpleNamespace(dead=_workers(SimpleNamespace(exitcode=None)).dead)  # DeviceTensorParallel.dead
    check_followers(alive)
    dead = SimpleNamespace(dead=_workers(SimpleNamespace(exitcode=-9)).dead)
    with pytest.raises(RuntimeError, match=r"^tensor-parallel rank 1 died \(exit code -9\); the other GPUs") as e:
        check_followers(dead)
    assert "\n" not in str(e.value)
