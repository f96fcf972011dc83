"""The rejection's later rounds spread over the whole launch (sampling_reject, BLINK_SAMPLER_REJECT="Rp").

A row's own programs run its first round. A later round is for the few rows still pending (session 42, H100: one to
six of 32), and when only those rows' 16 programs each stream an 8k-token chunk of it, the round costs 7-16 us while
the launch's other ~500 programs have finished. Here a row left pending goes into a queue instead, as U units of
UNIT tokens (sampling_grid.POOL_UNIT: 2k at V = 128k, 63 units a row), and every program that has finished its
first round takes units off the queue until no row can come back: a round then costs about one unit's latency.
  - The queue: the deciding program reserves an entry (POOL_TAIL), writes the row and round there with release
    semantics; an empty entry reads 0. A program claims units in order (POOL_CLAIM): unit c is unit c % U of entry
    c // U, and it waits for that entry. POOL_DONE counts the rows no round will take again; the row that completes
    it writes -1 into every entry past the tail, and a program that reads -1 leaves. (An entry past the tail
    whose row is not done would need a pending row that has not reserved it: the waiting program's own unit of
    it would then come from an entry that does not exist.)
  - A unit adds its count and top_p weight into the row's cells with integer atomics (exact, in any order) and its
    race winner by a 64-bit atomic max of (score's sortable bits, inverted token id): the same winner and the same
    tie to the lower id as the per-chunk partials' merge (sampling_reject_sync.merge_race). The row's ticket counts
    on from its first round; the unit that completes a round decides (sampling_reject_decide), clears the cells and
    queues the row again or counts it done.
  - Waiting needs every program it waits for to be running, so a program waits only once every row's first-round
    cell has been handed out (every row's first round is then being run; may_join). The launch has HELPERS cells
    past the rows' (sampling_grid.POOL_HELPERS), handed out after them all and so always safe to wait: they start as
    first-round programs leave, and a first-round program joins them only once every helper has started; the others
    leave. Session 43 (H100) let every program of a 32-row launch join: ~500 programs polling through the whole
    first round cost +10 us on a draw with nothing to queue.
    The interpreter runs programs one after another and never waits (WAIT=False): its first program then runs
    every queued round alone.
Words: plan.pool_words (sampling_plan.POOL_*), zeroed by the penalties kernel; the cells: reject_pool
[S, CELL_WORDS] i64 (race key, weight, count; then the queued row's record, hand_on).
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.sampling_bucket import _row_source
from blink.kernels.sampling_plan import (
    COUNTERS,
    POOL_CLAIM,
    POOL_DONE,
    POOL_QUEUE,
    POOL_TAIL,
    REJECT_CELLS,
    REJECT_TICKET,
    REJECT_WORDS,
)
from blink.kernels.sampling_reject_decide import decide
from blink.kernels.sampling_reject_pass import race_above
from blink.kernels.sampling_select import canonical

_NONE = tl.constexpr(-9223372036854775807 - 1)  # an empty race cell: below every packed score
_ROUND_BITS = tl.constexpr(16)  # an entry: row * 16 + round (round >= 2: never 0)


@triton.jit
def _race_key(best, token):
    """(score, token) packed so that a larger int64 is a better score, or the lower id at an equal score."""
    score = tl.where(best == 0.0, 0.0, best)  # -0.0 and 0.0 tie in the merge's float compare: one key for both
    bits = score.to(tl.int32, bitcast=True)
    sortable = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: their order reversed, below the positive ones
    return (sortable.to(tl.int64) << 32) | (tl.full([], 0xFFFFFFFF, tl.int64) - token.to(tl.int64))


@triton.jit
def _key_token(key, vocab_size: tl.constexpr):
    low = tl.full([], 0xFFFFFFFF, tl.int64)
    return tl.where(key == _NONE, vocab_size, (low - (key & low)).to(tl.int32))


# int64 words a row: the cells (race key, weight, count), then the queued row's record (hand_on); a 128-byte line
# each, so rows' atomics do not share one
CELL_WORDS = tl.constexpr(16)


@triton.jit
def _pause(x):
    """x, after a nanosleep: hundreds of programs polling without one would crowd the L2 and the SMs' issue slots."""
    return tl.inline_asm_elementwise("{ nanosleep.u32 256; mov.u32 $0, $1; }", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _f32_word(x):
    return x.to(tl.int32, bitcast=True).to(tl.int64)


@triton.jit
def _word_f32(cells, word):
    return tl.load(cells + word, cache_modifier=".cg").to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def row_done(words_ptr, num_rows, ROUNDS: tl.constexpr):
    """Count a row no round takes again. The row that completes the count marks every entry left unwritten as never
    coming (-1), which ends the programs waiting for them."""
    tl.debug_barrier()  # every thread's stores of the row's state come before the release below
    if tl.atomic_add(words_ptr + POOL_DONE, 1, sem="acq_rel", scope="gpu") == num_rows - 1:
        # every row is done, so every reserved entry is written: the tail is final
        tail = tl.atomic_add(words_ptr + POOL_TAIL, 0, sem="acquire", scope="gpu")
        for start in range(0, num_rows * (ROUNDS - 1), 256):
            e = start + tl.arange(0, 256)
            tl.store(words_ptr + POOL_QUEUE + e, tl.full([256], -1, tl.int32),
                     mask=(e >= tail) & (e < num_rows * (ROUNDS - 1)))


@triton.jit
def hand_on(words_ptr, pool_ptr, row, next_round, pending, num_rows, src, processed, candidate, inv_temperature,
            s_max, cutoff, top_k, top_p, hash_of_row, ROUNDS: tl.constexpr):
    """After a row's round (its deciding program, past the state's stores): queue it for round next_round when it
    is pending (with `candidate` next) and rounds are left, else count it done (row_done). A queued row's cells are
    cleared and its record written: what every unit of the round would otherwise find through three dependent
    loads (the slot, its parameters and the row's maximum, then the candidate's value)."""
    if pending & (next_round <= ROUNDS):
        cells = pool_ptr + row * CELL_WORDS
        tl.store(cells, tl.full([], _NONE, tl.int64))
        tl.store(cells + 1, tl.zeros([], tl.int64))
        tl.store(cells + 2, tl.zeros([], tl.int64))
        tl.store(cells + 3, candidate.to(tl.int64))
        tl.store(cells + 4, _f32_word(canonical(tl.load(src + candidate))))
        tl.store(cells + 5, _f32_word(inv_temperature))
        tl.store(cells + 6, _f32_word(s_max))
        tl.store(cells + 7, _f32_word(cutoff))
        tl.store(cells + 8, _f32_word(top_p))
        tl.store(cells + 9, top_k.to(tl.int64))
        tl.store(cells + 10, hash_of_row.to(tl.int64))
        tl.store(cells + 11, processed.to(tl.int64))
        entry = tl.atomic_add(words_ptr + POOL_TAIL, 1, sem="relaxed", scope="gpu")
        tl.debug_barrier()  # every thread's stores come before the release below
        tl.atomic_xchg(words_ptr + POOL_QUEUE + entry, row * _ROUND_BITS + next_round, sem="release", scope="gpu")
    else:
        row_done(words_ptr, num_rows, ROUNDS)


@triton.jit
def may_join(counter_ptr, row, num_rows, P: tl.constexpr, HELPERS: tl.constexpr):
    """Whether this program of the one-launch grid waits for the pool's units. Waiting is safe once every row's
    first-round cell has been handed out (sampling_reject_sync.program_cell): a helper's cell comes after them all.
    A first-round program joins only once every helper has started too (the first round is then nearly over):
    hundreds of programs polling through the first round would slow it."""
    cells = tl.atomic_add(counter_ptr + REJECT_CELLS, 0, sem="relaxed", scope="gpu")
    return (row >= num_rows) | (cells >= num_rows * P + HELPERS)


@triton.jit
def _unit(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr, num_rows, row,
          round, unit, vocab_size: tl.constexpr, P: tl.constexpr, KEY_BYTES: tl.constexpr, RACE: tl.constexpr,
          U: tl.constexpr, UNIT: tl.constexpr, UNIT_BLOCK: tl.constexpr, ROUNDS: tl.constexpr):
    """One unit of a row's round `round`; the unit that completes the round decides it."""
    state = reject_ptr + row * REJECT_WORDS
    cells = pool_ptr + row * CELL_WORDS  # the record hand_on wrote: independent loads, one trip
    candidate = tl.load(cells + 3, cache_modifier=".cg").to(tl.int32)
    value = _word_f32(cells, 4)
    inv_temperature = _word_f32(cells, 5)
    s_max = _word_f32(cells, 6)
    cutoff = _word_f32(cells, 7)
    top_p = _word_f32(cells, 8)
    top_k = tl.load(cells + 9, cache_modifier=".cg").to(tl.int32)
    hash_of_row = tl.load(cells + 10, cache_modifier=".cg").to(tl.uint32)
    processed = tl.load(cells + 11, cache_modifier=".cg") != 0
    src = _row_source(logits_ptr, processed_ptr, row, processed, vocab_size)
    best, token, count, weight, _, _ = race_above(src, unit, value, inv_temperature, s_max, cutoff, hash_of_row,
                                                  top_p < 1.0, False, False, vocab_size, KEY_BYTES, UNIT, UNIT_BLOCK,
                                                  True)
    if best > float("-inf"):
        tl.atomic_max(cells, _race_key(best, token), sem="relaxed", scope="gpu")
    if weight > 0:
        tl.atomic_add(cells + 1, weight, sem="relaxed", scope="gpu")
    if count > 0:
        tl.atomic_add(cells + 2, count.to(tl.int64), sem="relaxed", scope="gpu")
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + row * COUNTERS + REJECT_TICKET, 1, sem="acq_rel", scope="gpu")
    if ticket == P + (round - 1) * U - 1:  # the first round took P tickets, each later one U
        key = tl.atomic_add(cells, 0, sem="relaxed", scope="gpu")
        weight_above = tl.atomic_add(cells + 1, 0, sem="relaxed", scope="gpu").to(tl.float64)
        above = tl.atomic_add(cells + 2, 0, sem="relaxed", scope="gpu").to(tl.int32)
        total_lo = tl.load(state + 2, cache_modifier=".cg")
        total_hi = tl.load(state + 3, cache_modifier=".cg")
        following = _key_token(key, vocab_size)
        pending = decide(state, race_ids_ptr, row, src, candidate, value, inv_temperature, s_max, cutoff, top_k,
                         top_p, above, weight_above, weight_above, total_lo, total_hi, following, vocab_size, RACE)
        hand_on(words_ptr, pool_ptr, row, round + 1, pending, num_rows, src, processed, following, inv_temperature,
                s_max, cutoff, top_k, top_p, hash_of_row, ROUNDS)


@triton.jit
def pool_rounds(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr, num_rows,
                vocab_size: tl.constexpr, P: tl.constexpr, KEY_BYTES: tl.constexpr, RACE: tl.constexpr,
                U: tl.constexpr, UNIT: tl.constexpr, UNIT_BLOCK: tl.constexpr, ROUNDS: tl.constexpr,
                WAIT: tl.constexpr):
    """Take queued units until none is left (WAIT: until every row is done)."""
    entries = num_rows * (ROUNDS - 1)  # a row is queued at most once a later round
    more = tl.full([], 1, tl.int32)  # a tensor from the start: the loop carries it
    while more != 0:
        claim = tl.atomic_add(words_ptr + POOL_CLAIM, 1, sem="relaxed", scope="gpu")
        entry_index = claim // U
        entry = tl.zeros([], tl.int32)
        if entry_index < entries:
            word = words_ptr + POOL_QUEUE + entry_index
            entry = tl.atomic_add(word, 0, sem="acquire", scope="gpu")
            if WAIT:  # poll the entry with plain loads and pauses (hundreds of programs may wait), then acquire it
                while entry == 0:
                    entry = tl.load(word + (_pause(entry) - entry), volatile=True)  # the load waits for the pause
                if entry > 0:
                    entry = tl.atomic_add(word, 0, sem="acquire", scope="gpu")
        more = (entry > 0).to(tl.int32)  # 0: nothing was queued there (WAIT=False); -1: nothing ever will be
        if entry > 0:
            _unit(logits_ptr, processed_ptr, counter_ptr, reject_ptr, race_ids_ptr, pool_ptr, words_ptr, num_rows,
                  entry // _ROUND_BITS, entry % _ROUND_BITS, claim % U, vocab_size, P, KEY_BYTES, RACE, U, UNIT,
                  UNIT_BLOCK, ROUNDS)
