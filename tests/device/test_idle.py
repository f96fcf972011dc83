"""Device mode's idle policy (issue 19): `--device-idle` parsing, the GPU loop's idle turns built for the
host (csrc/sched_idle.h: the backoff caps, parking), and the host thread that relaunches a parked loop,
driven with a stand-in for the CUDA calls over a real segment."""
from __future__ import annotations

import ctypes as C
import threading
import time

import numpy as np
import pytest

from blink.config import EngineArgs, parse_device_idle
from blink.device import idle, structs
from blink.request import SamplingParams
from blink.transport.layout import SegmentLayout
from blink.transport.rings import IngressProducer
from blink.transport.shm import HEAD_INDEX, TAIL_INDEX, Segment


def test_the_flag_parses_or_names_itself():
    assert parse_device_idle("spin") == ("spin", 0.0, 8, 0.0, 0)
    assert parse_device_idle("deep") == ("deep", 10.0, 100, 0.0, 0)
    assert parse_device_idle("deep:2:500") == ("deep", 2.0, 500, 0.0, 0)
    assert parse_device_idle("park") == ("park", 10.0, 100, 100.0, 1000)
    assert parse_device_idle("park:1000:100")[3:] == (1000.0, 100)
    for bad in ("nap", "deep:1:2000", "deep:x", "spin:3", "park:5", "park:50:2", "park:50:100:1"):
        with pytest.raises(ValueError, match="--device-idle"):
            parse_device_idle(bad)
    cli = EngineArgs(device_idle="park:200").to_cli()
    assert cli[cli.index("--device-idle") + 1] == "park:200"


def test_park_is_refused_under_tensor_parallelism_and_spin_keeps_todays_cap():
    cfg = structs.SchedConfig()
    with pytest.raises(ValueError, match="tensor parallelism"):
        idle.apply_device_idle(cfg, "park", tensor_parallel=True)
    idle.apply_device_idle(cfg, "spin", tensor_parallel=False)
    assert (cfg.idle_max_ns, cfg.idle_deep_max_ns, cfg.idle_deep_after_ns, cfg.idle_park_after_ns) == (8192, 8192, 0, 0)
    idle.apply_device_idle(cfg, "park:50", tensor_parallel=False)
    assert (cfg.idle_deep_max_ns, cfg.idle_deep_after_ns, cfg.idle_park_after_ns) == (100_000, 10**7, 5 * 10**7)


def idle_turns(h, seconds: float, min_turns: int = 0) -> tuple[list[int], list[int], float | None]:
    """Idle turns for `seconds` (and at least min_turns): the backoff after each, the codes, and when (s)
    the first park came."""
    out, codes, parked_at, t0 = [], [], None, time.monotonic()
    backoff = C.c_int32()
    while time.monotonic() - t0 < seconds or len(codes) < min_turns:
        code = h.lib.blink_sched_idle_turn(C.byref(h.params), C.byref(backoff))
        out.append(backoff.value)
        codes.append(code)
        if code == 2 and parked_at is None:
            parked_at = time.monotonic() - t0
    return out, codes, parked_at


def set_idle(h, spec: str) -> None:
    idle.apply_device_idle(h.params.cfg, spec, tensor_parallel=False)


def test_the_backoff_deepens_after_the_idle_threshold_and_never_beyond_its_cap(make):
    h = make()
    set_idle(h, "deep:10:64")
    backoffs, codes, _ = idle_turns(h, 0.04)
    assert set(codes) == {0}
    early = backoffs[:6]
    assert early == [512, 1024, 2048, 4096, 8192, 8192], "first: doubling up to 8 us"
    assert max(backoffs) == 64_000 and 64_000 in backoffs[-3:], "then up to the deep cap, no further"


def test_spin_never_sleeps_longer_than_8us_nor_parks(make):
    h = make()
    set_idle(h, "spin")
    backoffs, codes, _ = idle_turns(h, 0.02)
    assert max(backoffs) == 8192 and set(codes) == {0}


def test_the_loop_parks_once_idle_long_enough_and_starts_afresh(make):
    h = make()
    set_idle(h, "park:20")
    backoffs, codes, parked_at = idle_turns(h, 0.035)
    assert parked_at is not None and 0.02 <= parked_at < 0.035, parked_at
    k = codes.index(2)
    assert backoffs[k] == 256 and backoffs[k + 1] == 512, "the relaunched loop starts at the shortest sleep"
    assert codes.count(2) == 1, "a fresh idle period must last 20 ms again before the next park"


def test_no_park_with_tensor_parallel_followers(make):
    h = make(peers=1)
    set_idle(h, "park:12")
    _, codes, _ = idle_turns(h, 0.04)
    assert 2 not in codes


def test_a_drained_loop_stops_instead_of_parking(make):
    h = make()
    set_idle(h, "park:12")
    h.seg.control.ingress_closed = 1
    _, codes, _ = idle_turns(h, 0, min_turns=12)
    assert codes[-1] == 1 and 2 not in codes


class FakeCuda:
    """blink_stream_query / blink_loop_launch as the watcher sees them: 0 = the stream is idle."""

    def __init__(self):
        self.running = True  # the kernel runs until park() is called
        self.launches: list[float] = []
        self.lock = threading.Lock()

    def park(self):
        self.running = False

    def blink_stream_query(self, stream):
        return 600 if self.running else 0  # cudaErrorNotReady while the kernel runs

    def blink_loop_launch(self, exec_, stream):
        with self.lock:
            self.launches.append(time.perf_counter())
            self.running = True
        return 0


@pytest.fixture
def segment():
    layout = SegmentLayout(16, 512, 64)
    seg = Segment.create(f"blink-test-idle-{time.monotonic_ns()}", layout)
    yield seg
    seg.close()
    seg.unlink()


def wait_for(cond, timeout=5.0):
    t = time.monotonic()
    while not cond():
        assert time.monotonic() - t < timeout, "timed out"
        time.sleep(0.0005)


def test_the_watcher_relaunches_a_parked_loop_on_a_request_and_a_command(segment):
    import torch

    cuda = FakeCuda()
    w = idle.ParkWatcher(cuda, None, None, segment, torch.device("cpu"), poll_s=100e-6).start()
    try:
        assert w.watching() and not w.parked()
        cuda.park()
        wait_for(w.parked)
        beat = int(segment.control.heartbeat)
        time.sleep(0.02)
        assert not cuda.launches and int(segment.control.heartbeat) > beat, "parked: heartbeat on, no relaunch"
        latencies = []
        producer = IngressProducer(segment)
        for rid in range(20):  # a request wakes it; the fake kernel consumes it and parks again
            t = time.perf_counter()
            assert producer.submit(rid, [5, 6, 7], SamplingParams(max_tokens=1), timeout=0)
            wait_for(lambda n=rid: len(cuda.launches) == n + 1)
            latencies.append(cuda.launches[-1] - t)
            ring = segment.ring_header(segment.layout.ingress_header)
            ring[HEAD_INDEX] = ring[TAIL_INDEX]  # the fake kernel consumed it
            cuda.park()
            wait_for(w.parked)
        segment.control.reset_prefix_cache += 1  # a command wakes it too
        wait_for(lambda: len(cuda.launches) == 21)
        print(f"\nwatcher wake-up latency (submit -> relaunch call), p50 {np.median(latencies) * 1e6:.0f} us, "
              f"max {max(latencies) * 1e6:.0f} us")
        assert np.median(latencies) < 0.05, "anti-stall bound only"
    finally:
        w.stop()
    assert w.parks == 21 and w.error is None and not w.watching()


def test_a_watcher_that_dies_says_so_instead_of_passing_for_a_parked_loop(segment):
    # On the H200 the watcher's thread died at its first line (torch.cuda.set_device on a device without
    # an index), so the loop was never seen parked; now the failure is the watcher's error.
    import torch

    class BrokenCuda(FakeCuda):
        def blink_stream_query(self, stream):
            raise RuntimeError("the runtime call failed")

    w = idle.ParkWatcher(BrokenCuda(), None, None, segment, torch.device("cpu"), poll_s=100e-6).start()
    wait_for(lambda: w.error is not None)
    assert "the runtime call failed" in w.error and not w.watching() and not w.parked()
    w.stop()
