"""`--decode-pace-ms` on a GPU (issue 19, energy): device mode paced gives host mode's tokens, each decode step no
sooner than the pace after the last launch (the trace's launch stamps), and steps with admissions unpaced."""
from __future__ import annotations

import numpy as np
import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from tools.device_selftest import selftest_runs as runs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("no_tf32")]

ARGS = dict(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
            block_size=16, num_kv_blocks=64, max_model_len=1024)
PACE_MS = 3.0


def test_paced_device_mode_gives_host_modes_tokens_and_spaces_its_decodes():
    args = EngineArgs(**ARGS, decode_pace_ms=PACE_MS)
    loaded = LoadedModel.load(args)
    wave = runs.mixed_workload(12, 7, loaded.vocab_size, 64 * 16)
    ref = runs.run_all_at_once(HostEngine(EngineArgs(**ARGS), loaded), wave)
    dev = DeviceEngine(args, loaded)
    try:
        assert runs.compare(ref, runs.run_all_at_once(dev, wave), set(), logprob_tol=1e-3) == []
        dev.loop.stop()
        assert dev.segment.control.error_code == 0
        launches = dev.loop.read_trace()
    finally:
        dev.shutdown()
    starts = launches[:, 0].astype(np.int64)
    gaps_ms = np.diff(starts) / 1e6
    # most launches are decodes of a running batch; every gap below the pace is a step after a prefill was left
    assert np.median(gaps_ms) >= PACE_MS * 0.95, gaps_ms
