"""The two pieces of the GPU loop's check after a forward launched ahead (csrc/sched_ahead.h), on the host build:
Team::sync_or, the barrier that carries the team's decisions (a voting HostBarrier standing in for
__syncthreads_or), and the 32-byte row check gathered while the forward runs, against stops_on."""
from __future__ import annotations

import ctypes as C
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink.device import build, structs
from blink.transport.layout import FLAG_IGNORE_EOS
from blink.transport.ring import DESCRIPTOR_DTYPE

AHEAD_IDS = 7  # csrc/sched_entry.h kAheadIds


@pytest.fixture(scope="module")
def host_lib():
    return build.load_host_library()


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("mixed", [0, 1])
def test_every_rank_sees_whether_any_rank_voted_round_after_round(host_lib, threads, mixed):
    rng = random.Random(threads * 10 + mixed)
    rounds = 400
    # mostly quiet rounds, so a vote left over from an earlier round would show as a wrong True
    votes = np.array([rng.random() < 0.08 for _ in range(rounds * threads)], dtype=np.uint8)
    out = np.full(rounds * threads, 7, dtype=np.uint8)
    host_lib.blink_team_votes(threads, rounds, votes.ctypes.data, out.ctypes.data, mixed)
    expect = votes.reshape(rounds, threads).any(axis=1)
    assert expect.any() and not expect.all()
    assert (out.reshape(rounds, threads) == expect[:, None]).all()


def _row_check(host_lib, eos, stop_ids, min_tokens, ignore_eos, generated, token):
    cfg = structs.SchedConfig(num_eos=len(eos))
    for k, e in enumerate(eos):
        cfg.eos_ids[k] = e
    desc = np.zeros(1, DESCRIPTOR_DTYPE)
    desc["num_stop_ids"] = len(stop_ids)
    desc["stop_token_ids"][0, :len(stop_ids)] = stop_ids
    desc["min_tokens"] = min_tokens
    desc["flags"] = FLAG_IGNORE_EOS if ignore_eos else 0
    out = (C.c_int32 * 3)()
    host_lib.blink_ahead_row_check(C.byref(cfg), desc.ctypes.data, generated, token, out)
    return list(out)


@settings(max_examples=200, deadline=None)
@given(eos=st.lists(st.integers(0, 20), max_size=structs.MAX_EOS),
       stop_ids=st.lists(st.integers(0, 20), max_size=16), min_tokens=st.integers(0, 4),
       ignore_eos=st.booleans(), generated=st.integers(1, 6))
def test_a_row_check_stops_exactly_where_stops_on_does(host_lib, eos, stop_ids, min_tokens, ignore_eos, generated):
    ids = len(stop_ids) + (0 if ignore_eos else len(eos))
    for token in range(21):  # every id the lists can hold, and some they do not
        count, ahead, reference = _row_check(host_lib, eos, stop_ids, min_tokens, ignore_eos, generated, token)
        if generated - 1 < min_tokens:
            assert count == 0  # nothing stops it yet
        else:
            assert count == (ids if ids <= AHEAD_IDS else -1)
        if count >= 0:  # else take_ahead checks the entry itself (stops_on)
            assert ahead == reference, token
