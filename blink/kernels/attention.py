"""Paged attention over a mixed batch (prefill chunks and decodes together).

Shapes: q[T, Hq, D]; k_cache/v_cache[num_blocks, block_size, Hkv, D]; query_start_loc[S+1] int32;
seq_lens[S] int32 (KV length after this step); block_tables[S, max_blocks] int32. Query token i of
sequence s sits at absolute position seq_lens[s] - q_len[s] + i and sees KV positions <= that. GQA: query
head h reads KV head h // (Hq // Hkv). Output [T, Hq, D] in q's dtype. Rows of padding tokens (past
query_start_loc[S]) are zero in the reference and unspecified in the Triton version.

Triton design: a program owns one KV head and a tile of BLOCK_Q query tokens x all GROUP query heads that
share that KV head (BLOCK_M = BLOCK_Q * GROUP rows), so each KV tile is loaded once per group. Sequence s
owns program tiles starting at s + (query_start_loc[s] - s) // BLOCK_Q (attention_plan.py's tile map: every
sequence's first tile, then one more per BLOCK_Q of the tokens beyond one a sequence); that needs no data, so the
grid is (S + (T - S) // BLOCK_Q, Hkv, splits): a pure decode step has no empty program, and programs past a
sequence's queries exit at once. With splits > 1
(small batches, flash-decoding) each program covers a slice of the KV range and a second kernel (opt-in: the
tile's last split to finish) merges the partial results by their log-sum-exp (attention_merge.py). Tiles that
may carry a prefill chunk (CAUSAL_SPLIT) run the KV tiles that all their rows see whole without the causal
mask, and start with the heaviest tiles. One KV tile of the online softmax (and issue 17's chunk-tile variants
of it) lives in attention_tile.py.
attention_plan.py's AttentionTuning holds the launch knobs (tiles, warps, pipeline stages, how many programs
to aim for); decode's defaults come from H200 sweeps of the whole step, and bench/kernels/step_kernels.py
(the kernel alone), bench/kernels/fusion.py (the step) and bench/kernels/prefill_attention.py (chunks) weigh
alternatives.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from blink.kernels.attention_merge import NO_TILES, _merge_tile_if_last, merge_chunk, merge_splits
from blink.kernels.attention_plan import AttentionTuning, LaunchPlan, first_tile, launch_plan, tile_sequence
from blink.kernels.attention_tile import _attend_kv_tile, _warm_kv_tile
from blink.kernels.attention_ws import ws_chunk_attention, ws_chunk_runs
from blink.kernels.pdl import pdl_for, pdl_wait
from blink.kernels.prefetch import CAN_PREFETCH

_default = {"tuning": AttentionTuning()}


@contextlib.contextmanager
def default_tuning_switched(tuning: AttentionTuning):
    """The tuning of calls that pass none, inside the block (benches that weigh a tuning in the whole step;
    graphs captured inside keep it)."""
    before = _default["tuning"]
    _default["tuning"] = tuning
    try:
        yield
    finally:
        _default["tuning"] = before


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len KV entries of one sequence as a dense [seq_len, Hkv, D] tensor."""
    num_blocks = -(-seq_len // cache.shape[1])
    return cache[block_table[:num_blocks].long()].reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                        scale: float) -> torch.Tensor:
    out = torch.zeros_like(q)
    group = q.shape[1] // k_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        keys = _gather_kv(k_cache, block_tables[s], seq_len).float().repeat_interleave(group, dim=1)
        values = _gather_kv(v_cache, block_tables[s], seq_len).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[q_start:q_end].float(), keys) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores.masked_fill_(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return out


@triton.jit
def _kv_tiles_of_split(seq_len, context, q_first, q_len, split, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                       NUM_SPLITS: tl.constexpr, SPLIT_MIN_TILES: tl.constexpr):
    """(kv_end, first KV tile, end KV tile) of this split: the tile needs KV positions up to its last query's."""
    kv_end = tl.minimum(seq_len, context + tl.minimum(q_first + BLOCK_Q, q_len))
    num_kv_tiles = tl.cdiv(kv_end, BLOCK_N)
    splits = NUM_SPLITS
    if SPLIT_MIN_TILES > 0:
        # The grid is sized for the longest context (attention_plan.py); this sequence keeps the splits its KV
        # fills with SPLIT_MIN_TILES tiles each (rounded down: only a last split may get fewer).
        splits = tl.minimum(tl.maximum(num_kv_tiles // SPLIT_MIN_TILES, 1), NUM_SPLITS)
    tiles_per_split = tl.cdiv(num_kv_tiles, splits)
    kv_tile_begin = split * tiles_per_split
    return kv_end, kv_tile_begin, tl.minimum(kv_tile_begin + tiles_per_split, num_kv_tiles)


@triton.jit
def _warm_first_kv_tile(seq, seq_len, q_len, q_first, split, block_tables_ptr, stride_bt, k_cache_ptr, v_cache_ptr,
                        kv_head, head_dim, block_size, stride_cb, stride_co, stride_ch, BLOCK_Q: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                        SPLIT_MIN_TILES: tl.constexpr, PAGE: tl.constexpr, PREFETCH_KV: tl.constexpr):
    """EARLY_TABLE, before the wait: this program's first KV tile, warmed for its cached positions (_warm_kv_tile).
    Returns (cached, cache offsets) of its keys, for the tests."""
    context = seq_len - q_len
    _, first_kv_tile, _ = _kv_tiles_of_split(seq_len, context, q_first, q_len, split, BLOCK_Q, BLOCK_N, NUM_SPLITS,
                                             SPLIT_MIN_TILES)
    cached_end = tl.where(q_first < q_len, context, 0)  # a program past its queries warms nothing
    return _warm_kv_tile(first_kv_tile, cached_end, block_tables_ptr + seq.to(tl.int64) * stride_bt, k_cache_ptr,
                         v_cache_ptr, kv_head, head_dim, block_size, stride_cb, stride_co, stride_ch, BLOCK_N, BLOCK_D,
                         PAGE, PREFETCH_KV)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, partial_ptr, max_ptr, sum_ptr, ticket_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_co, stride_ch, stride_bt,
    num_seqs, num_q_heads, block_size, head_dim,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr, CAUSAL_SPLIT: tl.constexpr, SPLIT_MIN_TILES: tl.constexpr,
    SCALE_IN_EXP2: tl.constexpr, LAZY_RESCALE: tl.constexpr, PAGE: tl.constexpr,  # chunk tiles' (attention_tile.py)
    MERGE_CHUNK: tl.constexpr,  # > 0: the last split merges, this many splits a load (attention_merge.py)
    EARLY_TABLE: tl.constexpr, PREFETCH_KV: tl.constexpr,  # first KV tile warmed before the wait (attention_tile.py)
    PAGE_GATHER: tl.constexpr = False,  # a tile's table entries at once (attention_tile.py; off by default)
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD  # rows: (query token, head of the group), group padded
    tile, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if CAUSAL_SPLIT:
        # Heaviest first: a sequence's last tiles see the most keys, so the grid starts with them and the
        # causal tail does not run alone at the end (the GPU starts programs in order of program_id(0)).
        tile = tl.num_programs(0) - 1 - tile

    seq = tile_sequence(tile, query_start_loc_ptr, num_seqs, BLOCK_Q, BLOCK_S)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)  # issued with the loads above, not after the branch below
    q_first = (tile - first_tile(q_start, seq, BLOCK_Q)) * BLOCK_Q  # first query of this tile within the seq
    context = seq_len - q_len
    if EARLY_TABLE:  # the block table and the KV below `context` predate the graph's kernels too (pdl.py)
        _warm_first_kv_tile(seq, seq_len, q_len, q_first, split, block_tables_ptr, stride_bt, k_cache_ptr, v_cache_ptr,
                            kv_head, head_dim, block_size, stride_cb, stride_co, stride_ch, BLOCK_Q, BLOCK_N, BLOCK_D,
                            NUM_SPLITS, SPLIT_MIN_TILES, PAGE, PREFETCH_KV)
    # The step's metadata above predates the graph's kernels, so it is read before the wait (pdl.py);
    # q and the new tokens' KV come from the kernel before. Every program waits before it may exit.
    pdl_wait(USE_PDL)
    if q_first >= q_len:
        return

    rows = tl.arange(0, BLOCK_M)
    tokens = q_first + rows // GROUP_PAD
    heads = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (tokens < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = context + tokens
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < head_dim
    token_ids = (q_start + tokens).to(tl.int64)
    if SPLIT_MIN_TILES > 0:
        # A split past this sequence's own count exits before loading q, leaving the merge's "no tiles" marker.
        _, kv_tile_begin, kv_tile_end = _kv_tiles_of_split(seq_len, context, q_first, q_len, split, BLOCK_Q,
                                                           BLOCK_N, NUM_SPLITS, SPLIT_MIN_TILES)
        if kv_tile_begin >= kv_tile_end:
            stat_offs = (token_ids * num_q_heads + heads) * NUM_SPLITS + split
            tl.store(max_ptr + stat_offs, tl.full([BLOCK_M], NO_TILES, dtype=tl.float32), mask=row_valid)
            tl.store(sum_ptr + stat_offs, tl.zeros([BLOCK_M], dtype=tl.float32), mask=row_valid)
            if MERGE_CHUNK > 0:
                _merge_tile_if_last(partial_ptr, max_ptr, sum_ptr, out_ptr, ticket_ptr, q_start, q_first, q_len,
                                    kv_head, num_q_heads, stride_ot, stride_oh, head_dim, GROUP, GROUP_PAD, BLOCK_Q,
                                    NUM_SPLITS, BLOCK_D, MERGE_CHUNK)
            return
    q_offs = token_ids[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

    # This split's slice of the KV positions the tile needs.
    kv_end, kv_tile_begin, kv_tile_end = _kv_tiles_of_split(seq_len, context, q_first, q_len, split, BLOCK_Q,
                                                            BLOCK_N, NUM_SPLITS, SPLIT_MIN_TILES)
    # finite, so fully masked rows stay NaN-free; a split whose range holds no KV tile stores it as is, and the
    # merge reads that maximum as "no partial" (NO_TILES, one definition for both)
    m_i = tl.full([BLOCK_M], NO_TILES, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_args = (q, kv_end, q_pos, table_row, k_cache_ptr, v_cache_ptr, kv_head, dims, dim_valid, scale_log2,
               block_size, stride_cb, stride_co, stride_ch)
    masked_begin = kv_tile_begin
    if CAUSAL_SPLIT:
        # KV tiles ending at or before the tile's first query position are seen whole by every row (they end
        # before kv_end too): no mask there. The diagonal tiles after them keep the masked loop.
        masked_begin = tl.minimum(tl.maximum((context + q_first + 1) // BLOCK_N, kv_tile_begin), kv_tile_end)
        for kv_tile in range(kv_tile_begin, masked_begin):
            acc, m_i, l_i = _attend_kv_tile(acc, m_i, l_i, kv_tile, *kv_args, BLOCK_N, PRECISION, False,
                                            SCALE_IN_EXP2, LAZY_RESCALE, PAGE, PAGE_GATHER)
    for kv_tile in range(masked_begin, kv_tile_end):
        acc, m_i, l_i = _attend_kv_tile(acc, m_i, l_i, kv_tile, *kv_args, BLOCK_N, PRECISION, True, SCALE_IN_EXP2,
                                        LAZY_RESCALE, PAGE, PAGE_GATHER)

    out_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        out_offs = token_ids[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_offs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Partials are [T, Hq, NUM_SPLITS] (+ [D]) fp32, unnormalized; merged by a second kernel or the tile's
        # last split (attention_merge.py). A split without tiles (short sequences: 16 splits of a 300-token
        # context) writes its maximum alone (NO_TILES), and the merge reads no partial where it finds that.
        stat_offs = (token_ids * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(max_ptr + stat_offs, m_i, mask=row_valid)
        tl.store(sum_ptr + stat_offs, l_i, mask=row_valid)
        has_work = kv_tile_begin < kv_tile_end
        tl.store(partial_ptr + stat_offs[:, None] * BLOCK_D + dims[None, :], acc, mask=out_mask & has_work)
        if MERGE_CHUNK > 0:
            _merge_tile_if_last(partial_ptr, max_ptr, sum_ptr, out_ptr, ticket_ptr, q_start, q_first, q_len, kv_head,
                                num_q_heads, stride_ot, stride_oh, head_dim, GROUP, GROUP_PAD, BLOCK_Q, NUM_SPLITS,
                                BLOCK_D, MERGE_CHUNK)


def kernel_meta(plan: LaunchPlan, group: int, head_dim: int, num_seqs: int, block_size: int, fp32: bool,
                use_pdl: bool, merge_in_kernel: bool) -> tuple[dict, dict]:
    """(constexprs, compile options) of _paged_attention_kernel for `plan`: the launch's, and what the sm_90
    compile test builds for every plan the planner gives (tests/kernels/test_attention_plans_sm90.py)."""
    block_d = triton.next_power_of_2(head_dim)
    splits = plan.num_splits
    constexprs = dict(
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_Q=plan.block_q, BLOCK_N=plan.block_n,
        BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_seqs), NUM_SPLITS=splits,
        PRECISION="ieee" if fp32 else "tf32",  # fp32 exact: Triton's default is TF32
        USE_PDL=use_pdl, CAUSAL_SPLIT=plan.causal_split, SPLIT_MIN_TILES=plan.split_min_tiles,
        SCALE_IN_EXP2=plan.scale_in_exp2, LAZY_RESCALE=plan.lazy_rescale, PAGE=plan.page(block_size),
        MERGE_CHUNK=merge_chunk(splits, group, block_d) if merge_in_kernel else 0,
        EARLY_TABLE=plan.early_table, PREFETCH_KV=plan.early_table and CAN_PREFETCH, PAGE_GATHER=plan.page_gather)
    options = dict(num_warps=plan.num_warps, num_stages=plan.num_stages,
                   **({"maxnreg": plan.maxnreg} if plan.maxnreg else {}))
    return constexprs, options


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                           scale: float, num_splits: int | None = None,
                           tuning: AttentionTuning | None = None,
                           split_tickets: torch.Tensor | None = None) -> torch.Tensor:
    """split_tickets (attention_merge.split_tickets): zeroed int32 counters that let the last KV split merge
    inside the kernel; None, too few, or tuning.merge_in_kernel off: the separate merge kernel."""
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    assert block_tables.stride(-1) == 1
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    tuning = tuning or _default["tuning"]
    plan = launch_plan(num_tokens, num_seqs, num_q_heads, num_kv_heads, head_dim,
                       block_tables.shape[1] * block_size, tuning, num_splits)
    num_splits = plan.num_splits
    if plan.ws_chunk and ws_chunk_runs(q, k_cache):  # on Hopper, with whole-tile KV blocks (attention_ws.py)
        return ws_chunk_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                                  num_stages=tuning.prefill_ws_stages, mask_v_tail=tuning.prefill_ws_mask_v)
    block_d = triton.next_power_of_2(head_dim)
    out = torch.empty_like(q)
    if num_splits > 1:
        partial = torch.empty((num_tokens, num_q_heads, num_splits, block_d), dtype=torch.float32,
                              device=q.device)
        maxes = torch.empty((num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        sums = torch.empty_like(maxes)
    else:
        partial = maxes = sums = out  # unused
    merge_in_kernel = (num_splits > 1 and tuning.merge_in_kernel and split_tickets is not None
                       and split_tickets.numel() >= plan.num_tiles * num_kv_heads)
    use_pdl = pdl_for(q)
    constexprs, options = kernel_meta(plan, group, head_dim, num_seqs, block_size, q.dtype == torch.float32,
                                      use_pdl, merge_in_kernel)
    _paged_attention_kernel[(plan.num_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, partial, maxes, sums, split_tickets if merge_in_kernel else out,
        query_start_loc, seq_lens, block_tables, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        num_seqs, num_q_heads, block_size, head_dim, **constexprs, **options, launch_pdl=use_pdl)
    if num_splits > 1 and not merge_in_kernel:
        merge_splits(partial, maxes, sums, out, query_start_loc, num_seqs, use_pdl)
    return out
