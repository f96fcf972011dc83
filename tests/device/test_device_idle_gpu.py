"""`--device-idle` on a GPU (issue 19). On the H200 park never parked within 5 s on 2026-12-01 (the host's
watcher thread died at its first line); with that fixed, both park tests passed there on 2026-12-03 (session 18).
`--device-idle` on a GPU: a parked loop (its kernel ended, the host relaunches it) serves
what arrives after idle with host mode's tokens, several times over, and stops cleanly parked or not;
the deep backoff gives the same tokens too. Idle power itself: `tools/gpu_run.sh idle-power`."""
from __future__ import annotations

import time

import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from tools.device_selftest import selftest_runs as runs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("no_tf32")]

ARGS = dict(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
            block_size=16, num_kv_blocks=64, max_model_len=1024)  # the workload's prompts reach 576


def wait_parked(dev: DeviceEngine, timeout: float = 5.0) -> None:
    t = time.monotonic()
    while not dev.loop.watcher.parked():
        assert time.monotonic() - t < timeout, "the loop never parked"
        time.sleep(0.005)


@pytest.mark.parametrize("spec", ["park:20", "deep:1:500"])
def test_an_idle_loop_serves_what_comes_later_with_host_modes_tokens(spec):
    args = EngineArgs(**ARGS, device_idle=spec)
    loaded = LoadedModel.load(args)
    waves = [runs.mixed_workload(12, 20 + k, loaded.vocab_size, 64 * 16) for k in range(3)]
    waves = [[(100 * k + r, p, sp) for r, p, sp in w] for k, w in enumerate(waves)]
    host = HostEngine(args, loaded)
    refs = [runs.run_all_at_once(host, w) for w in waves]
    del host
    dev = DeviceEngine(args, loaded)
    try:
        for k, wave in enumerate(waves):
            time.sleep(0.1)  # past the idle thresholds: parked (park) or at the longest sleep (deep)
            if spec.startswith("park"):
                wait_parked(dev)
                assert dev.loop.alive(), "a parked loop is alive"
            assert runs.compare(refs[k], runs.run_all_at_once(dev, wave), set(), logprob_tol=1e-3) == [], k
        if spec.startswith("park"):
            assert dev.loop.watcher.parks >= 3 and dev.loop.watcher.error is None
            hb = dev.segment.control.heartbeat
            time.sleep(0.05)
            assert dev.segment.control.heartbeat != hb, "parked: the watcher keeps the heartbeat moving"
            wait_parked(dev)
        dev.loop.stop()  # parked: nothing runs; stop returns without the GPU's `exited`
        assert dev.segment.control.error_code == 0
    finally:
        dev.shutdown()


def test_a_reset_command_wakes_a_parked_loop():
    args = EngineArgs(**ARGS, device_idle="park:20")
    dev = DeviceEngine(args, LoadedModel.load(args))
    try:
        wait_parked(dev)
        assert dev.reset_prefix_cache(), "the relaunched loop applied the reset"
    finally:
        dev.shutdown()
