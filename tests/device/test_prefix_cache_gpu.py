"""Device mode with the prefix cache on a GPU: 200+ requests over shared prefixes, with aborts and
preemption, give host mode's tokens; the GPU's counters show real hits; reset works from the host."""
from __future__ import annotations

import random

import pytest

from blink.config import EngineArgs
from blink.core.loaded_model import LoadedModel
from blink.device.engine import DeviceEngine
from blink.host.engine import HostEngine
from blink.request import SamplingParams
from tools.device_selftest import selftest_runs as runs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900), pytest.mark.usefixtures("no_tf32")]


def shared_prefix_workload(n: int, vocab: int, seed: int = 5) -> list[runs.Request]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(k)] for k in (40, 64, 100, 7)]
    out = []
    for rid in range(1, n + 1):
        prompt = rng.choice(prefixes) + [rng.randrange(3, vocab) for _ in range(rng.randrange(0, 40))]
        if rid % 10 == 0 and out:  # a follow-up turn: an earlier prompt resent with more after it
            prompt = out[rng.randrange(len(out))][1] + [rng.randrange(3, vocab) for _ in range(5)]
        out.append((rid, prompt[:300], SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 48),
                                                      ignore_eos=True, logprobs=rng.choice([None, 2]))))
    return out


def test_device_mode_with_the_prefix_cache_matches_host_mode():
    args = EngineArgs(model="tiny-llama", device="cuda", dtype="float32", max_num_seqs=8,
                      max_num_batched_tokens=64, block_size=16, num_kv_blocks=40, max_model_len=512,
                      enable_prefix_caching=True)
    loaded = LoadedModel.load(args)
    reqs = shared_prefix_workload(220, loaded.vocab_size)
    host = HostEngine(args, loaded)
    ref = runs.run_all_at_once(host, reqs)
    assert host.stats().prefix_cache_hits > 0
    del host
    dev = DeviceEngine(args, loaded)
    try:
        aborts = {5: 0, 17: 3, 60: 1, 111: 7, 150: 2}
        got = runs.run_staggered(dev, reqs, aborts, seed=3)
        assert runs.compare(ref, got, set(aborts), logprob_tol=1e-3) == []
        s = dev.stats()
        assert s.preemptions > 0 and s.running == s.waiting == 0 and s.free_kv_blocks == s.total_kv_blocks
        assert s.prefix_cache_hits > s.prefix_cache_queries // 5, "shared prefixes hit on the GPU"
        assert dev.reset_prefix_cache()
        again = runs.run_all_at_once(dev, [(1000 + r, p, sp) for r, p, sp in reqs[:20]])
        assert runs.compare({1000 + r: ref[r] for r, _, _ in reqs[:20]}, again, set(), logprob_tol=1e-3) == []
        assert dev.segment.control.error_code == 0
    finally:
        dev.shutdown()
