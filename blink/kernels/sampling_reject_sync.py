"""How a row's programs meet between the rejection's rounds (sampling_reject).

With one launch a round (the interpreter's way, and any one-round plan) a round's end is the launch's end: the row's
last program, found by a ticket that counts on across launches, decides and the next launch reads its state. With
the rounds in one launch (sampling_reject.ROUNDS > 1, the GPU's way for plans of several rounds: a greedy row then
pays one empty launch, not one a round) the row's last program also releases the round (a counter), and the row's
other programs wait for that before they read the state and go on.

Waiting inside a kernel needs every program it waits for to run, so the programs take their (row, chunk) in the
order they start (a counter, as CUB's single-pass scan takes its tiles) rather than from program ids: whoever holds a
cell started before anyone holding a later one, so the rows before the newest started row are whole and finish,
and the only row that can still wait for programs not started yet needs P slots on the GPU at once (16 at most
here; the device scheduler's resident kernel or other kernels may hold the rest). Loads of what other programs
wrote inside the launch bypass L1 (".cg"): an SM's L1 may hold a line read in an earlier round.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_plan import COUNTERS, REJECT_CELLS, REJECT_RELEASED, REJECT_TICKET


@triton.jit
def program_cell(counter_ptr, P: tl.constexpr, IN_ORDER: tl.constexpr):
    """This program's (row, chunk): its program ids, or (IN_ORDER, a one-dimensional grid) the next cell in the
    order the programs start (row 0's spare counter, which the penalties kernel zeroes)."""
    if IN_ORDER:
        cell = tl.atomic_add(counter_ptr + REJECT_CELLS, 1, sem="relaxed", scope="gpu")
        row, chunk = cell // P, cell % P
    else:
        row, chunk = tl.program_id(0), tl.program_id(1)
    return row, chunk


@triton.jit
def last_of_row(counter_ptr, row, launches):
    """After this program's partial stores: whether it is the row's last program in this round. The ticket counts
    on across rounds (the penalties kernel zeroes it), so the last one of round n sees n * P - 1."""
    tl.debug_barrier()  # every thread's stores come before the release below
    return tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_TICKET, 1, sem="acq_rel", scope="gpu") == launches - 1


@triton.jit
def release_round(counter_ptr, row):
    """The last program, after its state stores: the row's other programs may read them."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_RELEASED, 1, sem="release", scope="gpu")


@triton.jit
def wait_round(counter_ptr, row, rounds):
    """Until the row's first `rounds` rounds are released (inside one launch only: the interpreter runs its
    programs one after another, so a wait there would never end)."""
    released = tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_RELEASED, 0, sem="acquire", scope="gpu")
    while released < rounds:
        released = tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_RELEASED, 0, sem="acquire", scope="gpu")


@triton.jit
def merge_race(part_best_ptr, part_token_ptr, row, vocab_size: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr):
    """The row's race winner over its chunks' partials (vocab_size if none)."""
    c = tl.arange(0, P_PAD)
    best = tl.load(part_best_ptr + row * P + c, mask=c < P, other=float("-inf"), cache_modifier=".cg")
    token = tl.load(part_token_ptr + row * P + c, mask=c < P, other=vocab_size, cache_modifier=".cg")
    return tl.min(tl.where(best == tl.max(best, 0), token, vocab_size), 0)


@triton.jit
def sum_parts(ptr, row, P: tl.constexpr, P_PAD: tl.constexpr):
    """The sum of the row's chunk partials at ptr."""
    c = tl.arange(0, P_PAD)
    return tl.sum(tl.load(ptr + row * P + c, mask=c < P, other=0, cache_modifier=".cg"), 0)
