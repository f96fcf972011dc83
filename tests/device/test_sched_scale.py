"""`blink bench offline`'s device-mode configuration (llama3-8b shape) through the host-built scheduler:
64 seqs, a 2048-token budget and its 12 buckets, max_model_len 400, a 25,000-block KV pool, vocab 128256,
the bench's warm-up (2 x 4 tokens) then 64 x (256 prompt, 128 output) submitted at once, then batch 1.
Nothing in the scheduler's tables, stacks, rings or arithmetic may run out or wrap at these sizes."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from blink.core.limits import make_buckets
from blink.device import structs
from blink.device.engine import default_layout
from blink.device.runtime import max_requests_for
from blink.request import FinishReason, SamplingParams
from tests.device.harness import Config, HostScheduler, reference

pytestmark = pytest.mark.timeout(120)

SEQS, BUDGET, MAX_LEN, BLOCK, BLOCKS, VOCAB = 64, 2048, 400, 16, 25_000, 128_256
PROMPT, OUTPUT = 256, 128


def offline_config(team: int) -> Config:
    layout = default_layout(SimpleNamespace(max_model_len=MAX_LEN))  # what DeviceEngine creates
    return Config(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET, max_model_len=MAX_LEN, block_size=BLOCK,
                  num_blocks=BLOCKS, max_requests=max_requests_for(SEQS, MAX_LEN), vocab_size=VOCAB,
                  eos=(128_001, 128_009), ingress_capacity=layout.ingress_capacity,
                  arena_capacity=layout.arena_capacity, egress_capacity=layout.egress_capacity,
                  buckets=list(make_buckets(BUDGET, SEQS)), team=team, defer_publish=True)


def test_the_offline_configuration_fits_the_fixed_sizes():
    buckets = make_buckets(BUDGET, SEQS)
    assert len(buckets) <= structs.MAX_BUCKETS and buckets[-1] == (BUDGET, SEQS)
    layout = default_layout(SimpleNamespace(max_model_len=MAX_LEN))
    assert layout.arena_capacity >= SEQS * PROMPT  # every prompt submitted at once fits the arena
    assert layout.ingress_capacity >= SEQS + 2 and layout.egress_capacity >= SEQS
    assert max_requests_for(SEQS, MAX_LEN) >= SEQS + 2
    assert (BLOCKS * BLOCK) < 2**31  # slot ids as int32 before the int64 widening


@pytest.mark.parametrize("team", [1, 4])
def test_offline_workload_at_8b_scale_runs_to_completion(team):
    h = HostScheduler(offline_config(team))
    try:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, VOCAB - 1000, PROMPT).tolist() for _ in range(SEQS)]
        next_id = iter(range(1, 1000))

        def run(batch: list[list[int]], olen: int) -> list[int]:
            params = SamplingParams(temperature=0, max_tokens=olen, ignore_eos=True)
            ids = [next(next_id) for _ in batch]
            for rid, prompt in zip(ids, batch, strict=True):
                h.submit(rid, prompt, params)
            h.run(max_steps=1000)
            for rid, prompt in zip(ids, batch, strict=True):
                assert h.outputs(rid) == reference(prompt, params, VOCAB, h.cfg.eos, MAX_LEN)
                assert h.outputs(rid)[1] == FinishReason.LENGTH
            return ids

        run(prompts[:2], 4)  # the bench's warm-up
        first_plan = len(h.plans)
        run(prompts, OUTPUT)
        main = h.plans[first_plan:]
        # Prefill chunks fill the 2048-token budget (decodes of the admitted first), then batch-64 decodes.
        tokens = [sum(r[2] for r in p) for p in main]
        assert tokens[:8] == [BUDGET] * 8 and [len(p) for p in main[:9]] == [8, 16, 24, 32, 40, 48, 56, 64, 64]
        assert sum(tokens) == SEQS * PROMPT + SEQS * (OUTPUT - 1)  # every token computed once: no preemption
        assert len(main) == 9 + OUTPUT - 1  # the last prompts finish prefill in step 9
        run(prompts[:1], OUTPUT)
        i = h.info()
        assert (i["running"], i["waiting"], i["preemptions"], i["error_code"]) == (0, 0, 0, 0)
        assert i["free_blocks"] == BLOCKS and i["free_entries"] == h.cfg.max_requests
        assert i["tokens"] == 2 * 4 + SEQS * OUTPUT + OUTPUT
        assert i["fast_plans"] >= OUTPUT - 1  # the decode steps took the team fast path
    finally:
        h.close()
