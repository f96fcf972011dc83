"""Device-mode tensor parallelism, the scheduler's half: every step's inputs also land in each other rank's
buffers (the follower graphs read exactly what rank 0's graph reads), and the mailbox word it posts."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from blink.device import structs
from blink.request import SamplingParams

pytestmark = pytest.mark.timeout(120)

PER_TOKEN = ("input_ids", "positions", "slot_mapping")
PER_ROW = ("seq_lens", "logits_indices", "sample_slots", "sample_positions")


def _mismatches(local: dict, peer: dict, bucket: tuple[int, int], block_size: int) -> list[str]:
    t, s = bucket
    bad = [n for n in PER_TOKEN if not np.array_equal(local[n][:t], peer[n][:t])]
    bad += [n for n in PER_ROW if not np.array_equal(local[n][:s], peer[n][:s])]
    if not np.array_equal(local["query_start_loc"][:s + 1], peer["query_start_loc"][:s + 1]):
        bad.append("query_start_loc")
    for row in range(s):  # attention reads a row's blocks up to its sequence length only
        used = -(-int(local["seq_lens"][row]) // block_size)
        if not np.array_equal(local["block_tables"][row, :used], peer["block_tables"][row, :used]):
            bad.append(f"block_tables[{row}]")
    return bad


@pytest.mark.parametrize(("team", "launch_ahead"), [(1, False), (3, False), (3, True)])
def test_every_step_reaches_each_peer_identically(make, team, launch_ahead):
    """A mixed workload with chunked prefill and preemption (tight pool): after each prepare, both peers'
    buffers of the step's parity equal rank 0's over everything the bucket's graph reads; with launch_ahead,
    steps launched ahead too (their inputs written during the forward before, their input ids after it)."""
    h = make(peers=2, team=team, num_blocks=12, max_num_batched_tokens=8, defer_publish=launch_ahead,
             launch_ahead=launch_ahead)
    checked = []

    def compare(parity: int, bucket: tuple[int, int]) -> None:
        for j in range(2):
            bad = _mismatches(h.buffers[parity], h.peer_buffers[j][parity], bucket, h.cfg.block_size)
            assert not bad, f"peer {j + 1}, step {len(checked)}, bucket {bucket}: {bad}"
        checked.append(bucket)

    h.after_prepare = compare
    for rid in range(1, 7):
        h.submit(rid, [3 + (rid * k) % 40 for k in range(3 + 4 * rid)],
                 SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    h.run()
    assert len(checked) > 10 and len({b for b in checked}) > 1  # several steps, several buckets
    assert h.info()["preemptions"] > 0
    assert all(len(h.events[r]) == 6 for r in range(1, 7))
    if launch_ahead:
        assert h.ahead_counts()[0] > 0, "some steps went ahead"


def test_mailbox_word_is_step_then_command(make):
    h = make(peers=3)
    h.lib.blink_post_to_peers(C.byref(h.params), 41, 5)
    assert h.mailboxes.tolist() == [(41 << 32) | 5] * 3
    h.lib.blink_post_to_peers(C.byref(h.params), 42, structs.PEER_STOP)
    assert h.mailboxes.tolist() == [(42 << 32) | structs.PEER_STOP] * 3


def test_without_peers_nothing_is_posted(make):
    h = make()
    h.lib.blink_post_to_peers(C.byref(h.params), 7, 1)  # params.peers is null: a no-op, not a crash
    assert h.mailboxes.tolist() == [0]
