"""The KV loop of the paged-attention kernel (attention.py): one KV tile of the online softmax, and issue 17's
prefill variants of it. Each variant is a constexpr that decode tiles leave off (attention_plan.py), so their
code is unchanged:

- SCALE_IN_EXP2: the row maximum is taken over the raw scores and the scale applied inside exp2's argument (one
  FMA per score instead of a multiply, then a subtract or an FMA). Exact for the maximum (rounding is monotone and
  the scale positive), last bits of p as with the compiler's own fusion.
- LAZY_RESCALE > 0 (a log2 threshold, FA4's lazy rescaling): the running maximum, the accumulator and the row sums
  are rescaled only when some row's maximum grew by more than the threshold; otherwise p = exp2(s - old max) stays
  below 2^threshold. Exact in math: the final division uses the same maximum as the sums.
- PAGE > 0 (_kv_offsets): the KV block size as a constexpr. With a runtime block size the paged gather's
  address math (a signed division and remainder per key, 64-bit products) was about a third of the loop's SASS.
  A block of whole tiles (64 or 128 tokens, 32-key decode tiles) takes one table entry a tile.
- PAGE_GATHER (PAGE below the tile; chunk tiles with prefill_page_gather, decode tiles with decode_page_gather): a
  tile's BLOCK_N // PAGE table entries loaded as one short vector and spread to the keys by tl.gather, instead of one
  gathered entry per key. Compiled for sm_90 (session 31, tools/attn_sass.py) a 128-key chunk tile at 16-token
  blocks then issues 592 instructions and 17 cp.async, as at 128-token blocks (590, 17; today 621, 24); a batch-8
  decode tile 413 (today 598, with the runtime block size). Not timed.
- EARLY_TABLE (_warm_kv_tile, decode tiles): before the PDL wait, the first KV tile's block-table entries for the
  cached positions (below `context`: what earlier steps wrote), and, compiled (PREFETCH_KV), an L2 prefetch of those
  positions' K and V lines, so that the loop's prologue finds both on chip. Loads only, results unchanged.

Not here: FA3's intra-warpgroup overlap (tile j+1's QK^T issued before tile j's softmax, the scores loop-carried).
Written out for Triton 3.6 it compiled for sm_90 with the wait right after the issue (warp_group_dot_wait pendings
0: no overlap) and 236 bytes of spills at 128 x 128 over 8 warps (session 17), so it was dropped.
"""
from __future__ import annotations

import triton
import triton.language as tl

from blink.kernels.prefetch import prefetch_l2


@triton.jit
def _kv_offsets(kv_tile, kv_end, table_row, kv_head, block_size, stride_cb, stride_co, stride_ch,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PAGE: tl.constexpr, PAGE_GATHER: tl.constexpr = False):
    """(positions, which are < kv_end, cache offsets) of a KV tile's keys: one block-table entry per key.
    PAGE > 0: the block size as a constexpr that divides BLOCK_N, so each key's table index is the tile's first
    plus a constant and its place in the block a constant (no division by a runtime block size in the loop); or
    a multiple of BLOCK_N, so the tile lies in one block: one table entry for the tile, its keys in a row."""
    k_pos = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    k_valid = k_pos < kv_end
    if PAGE >= BLOCK_N:
        first = kv_tile * BLOCK_N
        if MASKED:  # a tile past kv_end (a split with no work) reads entry 0: its keys are all invalid
            block = tl.load(table_row + first // PAGE, mask=first < kv_end, other=0).to(tl.int64)
        else:
            block = tl.load(table_row + first // PAGE).to(tl.int64)
        return k_pos, k_valid, block * stride_cb + (first % PAGE + tl.arange(0, BLOCK_N)) * stride_co \
            + kv_head * stride_ch
    # PAGE < BLOCK_N stated again: in Triton 3.6 the return above does not end a compiled function, so what
    # follows is compiled too, and the gather's arange would get 0 entries (a block over the tile, session 34)
    if PAGE > 0 and PAGE < BLOCK_N and PAGE_GATHER:  # the tile's entries once, then each key's by its place
        ENTRIES: tl.constexpr = BLOCK_N // PAGE
        entries = kv_tile * ENTRIES + tl.arange(0, ENTRIES)
        if MASKED:  # an entry whose first key is past kv_end: its keys are all invalid
            blocks = tl.load(table_row + entries, mask=entries * PAGE < kv_end, other=0)
        else:
            blocks = tl.load(table_row + entries)
        block = tl.gather(blocks, tl.arange(0, BLOCK_N) // PAGE, 0).to(tl.int64)
    else:
        if PAGE > 0:
            entry = kv_tile * (BLOCK_N // PAGE) + tl.arange(0, BLOCK_N) // PAGE
        else:
            entry = k_pos // block_size
        if MASKED:
            block = tl.load(table_row + entry, mask=k_valid, other=0).to(tl.int64)
        else:
            block = tl.load(table_row + entry).to(tl.int64)
    if PAGE > 0:
        return k_pos, k_valid, block * stride_cb + (tl.arange(0, BLOCK_N) % PAGE) * stride_co + kv_head * stride_ch
    return k_pos, k_valid, block * stride_cb + (k_pos % block_size) * stride_co + kv_head * stride_ch


@triton.jit
def _warm_kv_tile(kv_tile, cached_end, table_row, k_cache_ptr, v_cache_ptr, kv_head, head_dim, block_size,
                  stride_cb, stride_co, stride_ch, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
                  PREFETCH_KV: tl.constexpr):
    """Before the PDL wait: KV tile kv_tile's block-table entries of positions < cached_end (the same loads as the
    loop's, masked), then with PREFETCH_KV one L2 prefetch per 128-byte line of their K and V rows. Compiled, the
    table load lives through the prefetch's addresses (without PREFETCH_KV it is dead code). Returns (cached, cache
    offsets) of the tile's keys (unused by the kernel; the tests read them)."""
    _, cached, kv_offs = _kv_offsets(kv_tile, cached_end, table_row, kv_head, block_size, stride_cb, stride_co,
                                     stride_ch, BLOCK_N, True, PAGE)
    if PREFETCH_KV:
        LINE: tl.constexpr = 1024 // k_cache_ptr.dtype.element_ty.primitive_bitwidth  # elements a 128-byte line
        LINES: tl.constexpr = (BLOCK_D + LINE - 1) // LINE
        starts = tl.arange(0, LINES) * LINE
        offs = kv_offs[:, None] + starts[None, :]
        mask = cached[:, None] & (starts < head_dim)[None, :]
        prefetch_l2(k_cache_ptr + offs, mask)
        prefetch_l2(v_cache_ptr + offs, mask)
    return cached, kv_offs


@triton.jit
def _softmax_pv(acc, m_i, l_i, scores, v_cache_ptr, kv_offs, dims, kv_mask, scale_log2, PRECISION: tl.constexpr,
                SCALE_IN_EXP2: tl.constexpr, LAZY_RESCALE: tl.constexpr):
    """The online softmax over one tile's masked scores (raw with SCALE_IN_EXP2, else in the log2 domain) and its
    PV product. m_i stays in the log2 domain (the merge and the epilogue read it so)."""
    m_tile = tl.max(scores, axis=1)
    if SCALE_IN_EXP2:
        m_tile = m_tile * scale_log2
    m_new = tl.maximum(m_i, m_tile)
    if LAZY_RESCALE > 0:
        # One maximum for the whole tile: Triton branches per program, not per warp.
        if tl.max(m_tile - m_i, axis=0) > LAZY_RESCALE:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        m_new = m_i
    if SCALE_IN_EXP2:
        p = tl.exp2(scores * scale_log2 - m_new[:, None])
    else:
        p = tl.exp2(scores - m_new[:, None])
    if LAZY_RESCALE > 0:
        l_i = l_i + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    else:
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_kv_tile(acc, m_i, l_i, kv_tile, q, kv_end, q_pos, table_row, k_cache_ptr, v_cache_ptr, kv_head, dims,
                    dim_valid, scale_log2, block_size, stride_cb, stride_co, stride_ch,
                    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr,
                    SCALE_IN_EXP2: tl.constexpr, LAZY_RESCALE: tl.constexpr, PAGE: tl.constexpr,
                    PAGE_GATHER: tl.constexpr = False):
    """One KV tile of the online softmax. MASKED=False: every key is visible to every row (the caller's
    promise), so the key mask is left out; tl.where(all true) is the identity, so the results are the same:
    bitwise under the interpreter; compiled for sm_90, the select no longer stands between the scaling and
    exp2's subtraction, so they fuse into one FMA (one rounding fewer: last-bit differences in exp2's argument)."""
    k_pos, k_valid, kv_offs = _kv_offsets(kv_tile, kv_end, table_row, kv_head, block_size, stride_cb, stride_co,
                                          stride_ch, BLOCK_N, MASKED, PAGE, PAGE_GATHER)
    if MASKED:
        kv_mask = k_valid[:, None] & dim_valid[None, :]
    else:
        kv_mask = dim_valid[None, :]  # broadcast over the keys by the loads
    k = tl.load(k_cache_ptr + kv_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if not SCALE_IN_EXP2:
        scores = scores * scale_log2  # log2 domain: exp2 is cheaper than exp
    if MASKED:
        visible = k_valid[None, :] & (k_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    return _softmax_pv(acc, m_i, l_i, scores, v_cache_ptr, kv_offs, dims, kv_mask, scale_log2, PRECISION,
                       SCALE_IN_EXP2, LAZY_RESCALE)
