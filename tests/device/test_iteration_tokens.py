"""The GPU scheduler's step histograms in the control block (ControlBlock.iteration_tokens, read by /metrics as
blink:iteration_tokens_total, and the busy step intervals), driven through the host build of the same C++ logic."""
from __future__ import annotations

import bisect
import time

from blink.request import SamplingParams
from blink.transport.layout import ITERATION_TOKEN_BOUNDS, step_interval_bucket


def test_every_step_lands_in_its_size_bucket(make):
    h = make(max_num_batched_tokens=16, max_model_len=64, num_blocks=64)
    h.submit(1, [3] * 3, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    h.submit(2, list(range(2, 32)), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    h.run()
    sizes = [sum(n for _, _, n, _ in plan) for plan in h.plans]
    expected = [0] * (len(ITERATION_TOKEN_BOUNDS) + 1)
    for size in sizes:
        expected[bisect.bisect_left(ITERATION_TOKEN_BOUNDS, size)] += 1
    ctl = h.seg.control
    assert list(ctl.iteration_tokens) == expected and sum(expected) == h.info()["steps"]
    assert ctl.iteration_tokens_sum == sum(sizes) == 33 + 6 + 2 - 2  # every prompt once, then the decodes
    assert len({bisect.bisect_left(ITERATION_TOKEN_BOUNDS, s) for s in sizes}) >= 2  # several buckets used


def test_first_records_carry_the_queue_time(make):
    h = make(max_num_seqs=1, max_num_batched_tokens=16, max_model_len=64, num_blocks=64)
    h.submit(1, [3] * 4, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    h.submit(2, [5] * 4, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))  # waits for 1
    h.run()
    first = {r: [e for e in h.events[r] if e.position == 0] for r in (1, 2)}
    later = [e.queue_us for r in (1, 2) for e in h.events[r] if e.position > 0]
    assert all(len(f) == 1 for f in first.values()) and later and set(later) == {0}
    # request 2 queued behind all 8 steps of request 1 (each a round trip through Python here)
    assert first[2][0].queue_us > first[1][0].queue_us and first[2][0].queue_us > 0


def test_busy_step_intervals_count_every_step_after_the_first_of_a_busy_run(make):
    """ControlBlock.step_intervals (blink:engine_step_interval_seconds): one interval per step whose previous
    step ended with no idle plan between; a forward held for 30 ms lands above the 25 ms bound."""
    h = make(max_num_batched_tokens=16, max_model_len=64, num_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    h.submit(1, [3] * 3, params)
    first = h.run()
    assert h.step() == 0  # an idle plan: the next step's interval is not a busy one
    h.submit(2, [4] * 3, params)
    h.after_prepare = lambda parity, bucket: time.sleep(0.03)
    second = h.run()
    ctl = h.seg.control
    counts = list(ctl.step_intervals)
    assert sum(counts) == (first - 1) + (second - 1) and first >= 4 and second >= 4
    assert sum(counts[step_interval_bucket(25_000_000) + 1:]) >= second - 1  # the held steps: over 25 ms
    assert ctl.step_intervals_sum_ns >= (second - 1) * 30_000_000
