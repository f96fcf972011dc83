"""Device mode on a GPU: greedy and seeded parity with host mode, aborts, shutdown (the full self-test
with timings is `python -m tools.device_selftest.gpu_selftest`)."""
from __future__ import annotations

import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from tools.device_selftest import selftest_runs as runs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("no_tf32")]


def test_device_mode_matches_host_mode():
    args = EngineArgs(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=8,
                      max_num_batched_tokens=64, block_size=16, num_kv_blocks=24, max_model_len=512)
    loaded = LoadedModel.load(args)
    greedy = runs.mixed_workload(40, 11, loaded.vocab_size, 24 * 16)
    seeded = [(r + 1000, p, sp) for r, p, sp in runs.mixed_workload(12, 12, loaded.vocab_size, 24 * 16, greedy=False)]
    host = HostEngine(args, loaded)
    ref, ref_seeded = runs.run_all_at_once(host, greedy), runs.run_all_at_once(host, seeded)
    del host
    dev = DeviceEngine(args, loaded)
    try:
        aborts = {3: 0, 7: 2, 11: 5}
        got = runs.run_staggered(dev, greedy, aborts, seed=1)
        assert runs.compare(ref, got, set(aborts), logprob_tol=1e-3) == []
        assert runs.compare(ref_seeded, runs.run_all_at_once(dev, seeded), set(), logprob_tol=1e-3) == []
        s = dev.stats()
        assert s.preemptions > 0 and s.running == s.waiting == 0 and s.free_kv_blocks == s.total_kv_blocks
        dev.loop.stop()
        assert dev.segment.control.exited == 1 and dev.segment.control.error_code == 0
    finally:
        dev.shutdown()
