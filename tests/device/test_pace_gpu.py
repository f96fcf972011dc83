"""`--decode-pace-ms` on a GPU (issue 19, energy): device mode paced gives host mode's tokens, each decode step no
sooner than the pace after the last launch (the trace's launch stamps), and steps with admissions unpaced; with
`--decode-pace-max-batch` only the small batches wait."""
from __future__ import annotations

import numpy as np
import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.device.structs import trace_step_sizes
from blink.host.engine import HostEngine
from tools.device_selftest import selftest_runs as runs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("no_tf32")]

ARGS = dict(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
            block_size=16, num_kv_blocks=64, max_model_len=1024)
PACE_MS = 3.0


def paced_launches(**pace) -> np.ndarray:
    """The trace of a paced device engine serving the mixed wave, after checking its tokens against host mode's."""
    args = EngineArgs(**ARGS, decode_pace_ms=PACE_MS, **pace)
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
    return launches


def test_paced_device_mode_gives_host_modes_tokens_and_spaces_its_decodes():
    launches = paced_launches()
    starts = launches[:, 0].astype(np.int64)
    gaps_ms = np.diff(starts) / 1e6
    # most launches are decodes of a running batch; every gap below the pace is a step after a prefill was left
    assert np.median(gaps_ms) >= PACE_MS * 0.95, gaps_ms


def test_a_max_batch_paces_only_the_small_decode_batches():
    launches = paced_launches(decode_pace_max_batch=3)
    tokens, rows = trace_step_sizes(launches)
    gaps_ms = np.diff(launches[:, 0].astype(np.int64)) / 1e6  # gap i: before launch i + 1
    decodes = (tokens == rows)[1:]
    small, large = gaps_ms[decodes & (rows[1:] <= 3)], gaps_ms[decodes & (rows[1:] > 3)]
    assert len(small) and len(large), (tokens, rows)
    assert np.median(small) >= PACE_MS * 0.95, small
    assert np.median(large) < PACE_MS * 0.5, large  # a tiny model's step is far below the pace
