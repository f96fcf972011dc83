"""Launch planning of the paged-attention kernel (attention.py): tile sizes, warps, pipeline depth, KV splits.

Every choice depends on shapes only, so a captured graph stays valid. Decode tiles (pure decode buckets) and
tiles that may carry a prefill chunk take their own knobs: decode is latency-bound, chunks compute-bound.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import triton
import triton.language as tl

_NUM_SMS_H200 = 132  # target for split-KV; over-splitting a smaller GPU is harmless


# The tile map, one definition for attention.py's and attention_ws.py's kernels: sequence s's query tiles start at
# s + (query_start_loc[s] - s) // BLOCK_Q, one tile a sequence plus one per BLOCK_Q tokens beyond one a sequence
# before it. That needs no data, so S + (T - S) // BLOCK_Q tiles cover any step of T tokens over S sequences
# (grid_tiles): none empty in pure decode, and tiles past a sequence's queries exit at once.
def grid_tiles(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """Query tiles in a grid that covers any composition of num_tokens over num_seqs (first_tile's bound)."""
    return num_seqs + max(num_tokens - num_seqs, 0) // block_q


@triton.jit
def first_tile(q_start, seq, BLOCK_Q: tl.constexpr):
    """Sequence seq's first query tile (padding sequences, with no tokens, may take the count below zero: clamped,
    it stays monotone)."""
    return seq + tl.maximum(q_start - seq, 0) // BLOCK_Q


@triton.jit
def tile_sequence(tile, query_start_loc_ptr, num_seqs, BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr):
    """The sequence that owns query tile `tile`: the last s whose first tile is <= tile."""
    if BLOCK_S == 1:
        seq = tile * 0  # one sequence: skip a dependent load (batch-1 decode is latency-bound)
    else:
        seq_ids = tl.arange(0, BLOCK_S)
        starts = tl.load(query_start_loc_ptr + seq_ids, mask=seq_ids < num_seqs, other=0)
        first_tiles = tl.where(seq_ids < num_seqs, first_tile(starts, seq_ids, BLOCK_Q), 2147483647)
        seq = tl.sum((first_tiles <= tile).to(tl.int32)) - 1
    return seq


@dataclass(frozen=True)
class AttentionTuning:
    """Launch knobs. Every choice depends on shapes only, so a captured graph stays valid."""

    block_n: int | None = None  # KV positions per tile; None: 64 for head_dim <= 128, else 32
    num_warps: int = 4
    # The knobs of decode tiles (pure decode buckets) and of tiles that may carry a prefill chunk. Decode's were
    # measured in llama3-8b's whole step on the H200 (perf.md, 2026-12-02 session 13): a two-deep cp.async
    # pipeline over the KV loop beat three at batch 1 / 2 / 8 / 32; splitting below 2 programs per SM (batch 32
    # in two) took the step at 4k context from 9.91 to 8.91 ms and changed nothing at 1k. Chunk tiles: below.
    num_stages: int = 2
    # Decode grids left unsplit (2+ programs an SM already: batch 33+ at 8 KV heads) take this depth instead. H200,
    # session 19 (perf.md): batch 64 at 1k, 512 programs of 16 KV tiles, 3 resident an SM by registers and shared
    # memory, read at 2.9 TB/s with 2 stages (ncu: 0.35 eligible warps a scheduler, stalled on loads); 3 stages
    # took the kernel 89.5 -> 69.7 us a layer. Split grids keep num_stages: 3 lost at batch 8 / 32 (2 / 8 tiles).
    unsplit_num_stages: int = 3
    # A register cap for decode tiles (None: the compiler's 168 a thread at 4 warps, so 3 programs an SM and 512
    # programs in 1.3 waves; 128 fits 4 where shared memory allows). Session 19: 128 changed the step by +0.1-0.8%
    # at batch 1-64 (worse at 8 alone), so off.
    decode_maxnreg: int | None = None
    split_below_per_sm: float = 2.0  # split the KV range only if fewer programs than this per SM have work,
    prefill_split_below_per_sm: float = 1.0
    programs_per_sm: int = 3  # and then until about this many programs per SM are busy
    max_splits: int = 16
    # A grid this small before splitting (batch 1: 8 programs for 8 KV heads) is latency-bound: 32-position KV
    # tiles over up to 32 splits finished the batch-1 step 0.6-1.7% sooner (at batch 2, 16 programs, 3% later).
    # None: the block_n and max_splits above everywhere.
    small_grid_programs: int | None = 8
    small_grid_block_n: int = 32
    small_grid_max_splits: int = 32
    # Splits chosen in the kernel (issue 17): a captured graph cannot know the context, so decode's grid is sized
    # for the longest (the rule above, aiming at grid_programs_per_sm with up to max_grid_splits) and each program
    # keeps only the splits its sequence's KV fills with split_min_tiles tiles; the others exit at once.
    # split_min_tiles None: the host's count, except for the batch-1 grid (the small grid above) when the block
    # table allows split_min_kv_len keys (a server started with a long --max-model-len): there
    # small_grid_split_min_tiles. H200, attention alone at batch 1 (perf.md, 2026-12-03 session 16): 2 tiles over
    # up to 64 splits took 1k / 4k / 8k / 32k contexts from 6.94 / 13.46 / 21.41 / 64.57 to 8.51 / 12.13 / 17.89 /
    # 46.94 us a layer; the whole batch-1 step at 32k 5.812 -> 5.322 ms (1.29x -> 1.18x its floor), at 1k with the
    # same 32k block table 4.160 -> 4.209 (+1.2%), hence the max len bound. At batch 8 no variant beat the host's count.
    split_min_tiles: int | None = None
    small_grid_split_min_tiles: int | None = 2
    split_min_kv_len: int = 16384
    max_grid_splits: int = 64  # a power of two
    grid_programs_per_sm: int | None = None  # None: programs_per_sm (a separate knob: chunk splits stay put)
    # Chunk tiles (issue 17: prefill attention ran at 26-37% of peak at 2k-32k tokens). From the H200 sweep of
    # bench/kernels/prefill_attention.py (perf.md, 2026-12-03 session 16): 128 rows x 128 keys, 8 warps, a two-deep
    # pipeline (160 KB of shared memory at head_dim 128: Hopper-sized) beat session 15's 64 rows x 64 keys, 4 warps,
    # 3 stages by 1.12x / 1.23x / 1.21x at 2k / 8k / 32k tokens and 1.20x for 2k after 30k cached. prefill_block_n
    # None: 128 up to head_dim 128, else block_n's rule. Buckets of fewer than prefill_min_tokens tokens keep
    # session 15's tiles (small_chunk_*, the block_n rule): in the (128, 64) bucket a 100-token chunk after 2,000
    # cached took 7.849 ms a step with the big tiles, 6.595 without; the buckets between are not measured. The causal
    # split runs the KV tiles that the whole query tile sees without the mask and the heaviest tiles first
    # (1.07-1.11x at 2k-32k); False: the decode tiles' loop.
    # Session 17 (perf.md): a five-deep pipeline (K/V two tiles ahead; 225 KB of shared memory at head_dim 128, so
    # larger heads keep 2 stages) with the KV block size compiled in and the scale inside exp2: 1.26x / 1.24x at 8k
    # / 32k tokens and 1.38x for 2k after 30k cached. Below prefill_min_tokens the compiled-in block size alone
    # (1.24x at 1k tokens, 1.11x for 100 after 2,000 cached); exp2 there was +/-3%, so it stays off.
    prefill_min_tokens: int = 2048
    prefill_block_m: int = 128  # rows: query tokens x the padded group
    prefill_block_n: int | None = None
    prefill_num_warps: int = 8
    prefill_num_stages: int = 5
    small_chunk_block_m: int = 64
    small_chunk_num_warps: int = 4
    small_chunk_num_stages: int = 3
    prefill_causal_split: bool = True
    # Issue 17's inner-loop variants of the chunk tiles (attention_tile.py; decode tiles never take them): the
    # scale inside exp2's FMA (big tiles; small_chunk_*: the others), lazy rescaling above a log2 threshold (0: off;
    # it lost 4-10% on the H200), the KV block size compiled in (where it divides the KV tile).
    prefill_scale_in_exp2: bool = True
    small_chunk_scale_in_exp2: bool = False
    prefill_lazy_rescale: float = 0.0
    prefill_const_page: bool = True
    # With the page compiled in below the tile (16-token blocks): a tile's table entries loaded at once and spread to
    # its keys (attention_tile.py's PAGE_GATHER: the 128-token block's loop; session 33, H100: prefill attention -2.3
    # to -7.2% at 2k-32k, the step -0.1 to -3.3%, bit-equal outputs; on unless BLINK_PAGE_GATHER=0)
    prefill_page_gather: bool = field(default_factory=lambda: os.environ.get("BLINK_PAGE_GATHER", "1") == "1")
    # The same two for decode tiles (session 18, not yet timed: `kernels` times them alone at batch 1-32). Decode
    # reads 8 x 1k keys at batch 8 at 2.4 TB/s (13.7 us a layer for 33.5 MB), where chunk tiles lost a third of
    # their loop to the runtime block size's divide and remainder.
    decode_const_page: bool = False
    # Decode tiles' own PAGE_GATHER (with decode_const_page): a bench variant, untimed (perf.md, session 31)
    decode_page_gather: bool = False
    decode_scale_in_exp2: bool = False
    # The block size compiled in for the batch-1 grid only (small_grid_programs): session 19 timed decode_const_page
    # alone at 6.85 -> 6.26 us a layer at batch 1 but slower at 8 / 32 (17.79 -> 19.16, 42.78 -> 48.75); for the
    # batch-1 grid only, with the in-kernel merge, the step went 4.155 -> 4.125 ms at batch 1.
    small_grid_const_page: bool = True
    # Split KV ranges merged by the tile's last split inside the attention kernel (attention_merge.py; needs the
    # caller's split tickets; without them the separate merge kernel runs) instead of a second kernel a layer.
    # Its first version (split by split) took llama3-8b's step from 4.177 to 4.482 ms at batch 1 on the H200
    # (session 18); today's chunked loads, H200 session 19 (perf.md): attention alone 17.79 -> 14.75 us a layer at
    # batch 8 and 42.78 -> 40.50 at 32; the whole step 4.175 -> 4.154 / 4.856 -> 4.764 / 6.042 -> 5.995 ms at
    # batch 1 / 8 / 32.
    merge_in_kernel: bool = True
    # Issue 17: before the PDL wait, decode tiles load their first KV tile's block-table entries and (compiled)
    # prefetch its cached K/V lines into L2, so that the table -> K/V round trips at the loop's start overlap the
    # previous kernel's tail (attention_tile.py's _warm_kv_tile). Chunk tiles never take it. Off: llama3-8b's whole
    # step on the H200, 4 runs side by side (perf.md, 2026-12-04 session 24), medians 4.101 -> 4.081 ms at batch 1
    # (ranges overlap), 4.663 -> 4.774 at 8 and 5.938 -> 5.997 at 32 (slower in every run).
    early_table: bool = False
    # Issue 17: big chunk tiles (prefill_min_tokens on, unsplit) run attention_ws.py's TMA + warp-specialised kernel
    # where it fits (Hopper, a 64- or 128-token KV block: `--block-size 128`). Built in session 27 without a GPU, so
    # off until timed (BLINK_PREFILL_WS=1 turns the default on).
    prefill_ws: bool = field(default_factory=lambda: os.environ.get("BLINK_PREFILL_WS", "0") == "1")
    # Its K/V buffers (the pass's num_stages): 2 at 128-token blocks (180 KB of shared memory at head_dim 128; 3 need
    # 246 KB, over Hopper's 227), up to 4 at 64-token blocks (180 KB).
    prefill_ws_stages: int = 2
    # V's rows past a sequence's end zeroed before the PV product (attention_ws.py's MASK_V_TAIL), as attention.py's
    # masked loads do, so that a stale inf / NaN in a reused block cannot reach the output
    prefill_ws_mask_v: bool = False


def _choose_splits(working_tiles: int, num_kv_heads: int, max_kv_len: int, block_n: int, programs_per_sm: int,
                   max_splits: int, split_below_per_sm: float) -> int:
    """Split the KV range only when the tiles with work leave SMs short (graph-safe: shapes only)."""
    programs = working_tiles * num_kv_heads
    if programs >= split_below_per_sm * _NUM_SMS_H200:
        return 1  # a full wave already streams the KV at bandwidth; a merge kernel would only add time
    wanted = triton.cdiv(programs_per_sm * _NUM_SMS_H200, programs)
    useful = triton.cdiv(max_kv_len, 2 * block_n)  # keep at least a couple of KV tiles per split
    splits = min(wanted, useful, max_splits)
    return triton.next_power_of_2(splits) if splits > 1 else 1


@dataclass(frozen=True)
class LaunchPlan:
    block_q: int  # query tokens per program (times the padded group: the tile's rows)
    block_n: int
    num_tiles: int
    num_splits: int
    num_stages: int
    num_warps: int
    causal_split: bool  # the kernel's CAUSAL_SPLIT: chunk tiles only, so decode compiles as before
    split_min_tiles: int = 0  # the kernel's SPLIT_MIN_TILES: 0 all num_splits splits, else the kernel's own count
    # The kernel's SCALE_IN_EXP2, LAZY_RESCALE and PAGE (page()): chunk tiles' knobs, or decode's (off by default)
    scale_in_exp2: bool = False
    lazy_rescale: float = 0.0
    const_page: bool = False
    maxnreg: int | None = None  # the launch's register cap (decode tiles' decode_maxnreg), None: the compiler's
    early_table: bool = False  # the kernel's EARLY_TABLE (decode tiles' early_table)
    # attention_ws.py's kernel instead (prefill_ws on, big chunk tiles, unsplit), where ws_chunk_runs takes the tensors
    ws_chunk: bool = False
    page_gather: bool = False  # the kernel's PAGE_GATHER (prefill_page_gather or decode_page_gather)

    def page(self, block_size: int) -> int:
        """The kernel's PAGE: the KV block size where it is compiled in (a power of two dividing the KV tile or a
        multiple of it), or 0."""
        fits = block_size & (block_size - 1) == 0 and (self.block_n % block_size == 0 or block_size % self.block_n == 0)
        return block_size if self.const_page and fits else 0

    def splits_with_work(self, kv_len: int) -> int:
        """Splits that get KV tiles for a decode row at kv_len keys (the kernel's rule, for benches and tests)."""
        tiles = triton.cdiv(kv_len, self.block_n)
        splits = self.num_splits
        if self.split_min_tiles:
            splits = min(max(tiles // self.split_min_tiles, 1), splits)
        return triton.cdiv(tiles, triton.cdiv(tiles, splits)) if tiles else 0


def launch_plan(num_tokens: int, num_seqs: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                max_kv_len: int, tuning: AttentionTuning, num_splits: int | None = None) -> LaunchPlan:
    group_pad = triton.next_power_of_2(num_q_heads // num_kv_heads)  # Qwen2.5 has groups of 5 and 7
    # Small query tiles only where the rows can all be decodes (tokens <= rows: the pure decode buckets).
    # A captured bucket holds any step up to its size, so (128 tokens, 64 rows) always carries a chunk,
    # e.g. 3 decodes + a 100-token prefix hit, which in 4-token tiles re-reads its 2,000-token context 25
    # times per head (perf.md, 2026-12-01 session 7). A chunk inside a (t, t) bucket keeps small tiles.
    decode_heavy = num_tokens <= num_seqs
    block_n = tuning.block_n or (64 if head_dim <= 128 else 32)
    # Each tile class's rows, warps and pipeline depth (chunk buckets from prefill_min_tokens on: the big tiles)
    big = not decode_heavy and num_tokens >= tuning.prefill_min_tokens
    if decode_heavy:
        rows, num_warps, num_stages = 16, tuning.num_warps, tuning.num_stages
    elif big:
        rows, num_warps, num_stages = tuning.prefill_block_m, tuning.prefill_num_warps, tuning.prefill_num_stages
        block_n = tuning.prefill_block_n or (128 if head_dim <= 128 else block_n)
        num_stages = num_stages if head_dim <= 128 else min(num_stages, 2)  # deeper would not fit 227 KB
    else:
        rows, num_warps, num_stages = (tuning.small_chunk_block_m, tuning.small_chunk_num_warps,
                                       tuning.small_chunk_num_stages)
    block_m = max(16, group_pad, rows)  # tl.dot needs M >= 16
    block_q = block_m // group_pad
    max_splits = tuning.max_splits
    # the tile map's bound (the data-free bound before, T // block_q + S, left 2 of 10 tiles empty at batch 8:
    # perf.md session 22)
    num_tiles = grid_tiles(num_tokens, num_seqs, block_q)
    # Tiles with work, in the composition that needs the splits most: a decode bucket's rows may each be
    # a sequence (one tile per token); a bucket that carries a chunk may hold that one chunk, whose tiles are
    # all the work (its padding tiles exit at once). Counting those padding tiles left (128, 64) unsplit:
    # a 100-token prefix hit then ran 56 programs over 2,100 keys each, 82 us per layer; split 8 ways, 58
    # (perf.md, 2026-12-01 session 8).
    working = min(num_tiles, num_tokens) if decode_heavy else max(1, num_tokens // block_q)
    small_grid = tuning.small_grid_programs is not None and working * num_kv_heads <= tuning.small_grid_programs
    if decode_heavy and small_grid:
        block_n, max_splits = min(block_n, tuning.small_grid_block_n), tuning.small_grid_max_splits
    programs_per_sm = tuning.programs_per_sm
    split_min_tiles = (tuning.split_min_tiles or 0) if decode_heavy else 0
    if decode_heavy and small_grid and not split_min_tiles and max_kv_len >= tuning.split_min_kv_len:
        split_min_tiles = tuning.small_grid_split_min_tiles or 0
    if split_min_tiles:
        max_splits, programs_per_sm = tuning.max_grid_splits, tuning.grid_programs_per_sm or programs_per_sm
    if num_splits is None:
        split_below = tuning.split_below_per_sm if decode_heavy else tuning.prefill_split_below_per_sm
        num_splits = _choose_splits(working, num_kv_heads, max_kv_len, block_n, programs_per_sm, max_splits,
                                    split_below)
    assert num_splits >= 1 and num_splits & (num_splits - 1) == 0, "num_splits must be a power of two"
    if decode_heavy and num_splits == 1:
        num_stages = tuning.unsplit_num_stages
    chunk = not decode_heavy
    scale_in_exp2 = (tuning.prefill_scale_in_exp2 if big else tuning.small_chunk_scale_in_exp2) if chunk \
        else tuning.decode_scale_in_exp2
    return LaunchPlan(block_q, block_n, num_tiles, num_splits, num_stages, num_warps,
                      chunk and tuning.prefill_causal_split, split_min_tiles if num_splits > 1 else 0,
                      scale_in_exp2, tuning.prefill_lazy_rescale if chunk else 0.0,
                      tuning.prefill_const_page if chunk else (tuning.decode_const_page
                                                                or (small_grid and tuning.small_grid_const_page)),
                      None if chunk else tuning.decode_maxnreg, tuning.early_table and not chunk,
                      tuning.prefill_ws and big and num_splits == 1,
                      page_gather=tuning.prefill_page_gather if chunk else tuning.decode_page_gather)
