"""Prefill-chunk attention on Hopper in the FlashAttention-3 style: TMA loads and warp specialisation (issue 17).

The same attention as attention.py's paged kernel over a step that carries prefill chunks, in the form Triton
3.6 can specialise: a KV loop whose loads are all tensor descriptors (TMA). Its Hopper pass
(NVGPUWarpSpecialization) then splits each program into a producer warp group that issues the K/V copies and two
consumer warp groups of 64 query rows that run the wgmma and the softmax, with setmaxnreg moving registers from
the producer (40) to the consumers (232-256). sm_90 PTX: 12 warps, 168 registers at launch, no spills
(tests/kernels/test_attention_ws.py pins it). What Triton 3.6 needs for that, found by compiling variants:

- one KV tile = one whole cache block (block_size == BLOCK_N, 64 or 128: `--block-size`). Hopper's TMA has no
  gather, so a tile must be one box of the cache [num_blocks, block_size, Hkv, D]: the 4-D descriptor's box is
  [1, BLOCK_N, 1, D] at (block, 0, kv_head, 0). The default 16-token blocks cannot be loaded so.
- every load a descriptor, in the loop and before it: pointer loads (K/V gathers, or q) fail the pass
  (WSLowerToken). So a program owns BLOCK_Q query tokens of ONE query head (a 2-D box of q [T, Hq * D]); the
  GQA packing of attention.py (one KV head's group in a tile: a 3-D box and a reshape) fails it too
  (WSDataPartition), and the group's programs share each K/V tile through the L2 instead, as FA3's do.
- one KV loop with the causal mask on every tile: a second loop (attention.py's unmasked tiles first) fails the
  pass (an MLIR dominance assertion).
- no KV splits: a chunk's grid fills the GPU (a 2,048-token chunk of llama3-8b: 16 query tiles x 32 heads).

One difference from attention.py: V comes whole from its box (it feeds the wgmma from shared memory, never
through registers), so the keys past a sequence's end in its last block enter the PV product with weight 0. The
cache starts zeroed and holds only values the model wrote, so 0 * v = 0 there; a model that once wrote inf or NaN
into a block would leave it to the next sequence that takes the block (attention.py masks those loads). MASK_V_TAIL
(AttentionTuning.prefill_ws_mask_v) zeroes those rows as attention.py does, at a price the GPU has not measured
(V through registers: 229 KB of shared memory and 220 bytes of spills at 128 x 128, ptxas). FlashAttention-3 and
-4 load V by TMA the same way and have the same property (Dao-AILab/flash-attention issue 2374, open); vLLM's answer
is to zero blocks as they are allocated. A free alternative here: the KV write zeroes a block's V rows past the
step's last token when the step enters the block (one block's zeros per block filled), so a tail is never stale.

The grid is (Hq, query tiles): the heads of one tile run side by side (their K/V in the L2), heaviest tiles first
(attention.py's CAUSAL_SPLIT order), and the tile -> sequence map is attention_plan.py's, as attention.py's. Not
used: on Hopper the specialised launch first deadlocked (session 28; q's host descriptor, WS_Q_DESCS), and with that
fixed it returns wrong results at 2k+ tokens (session 31, WS_REFUSED below), so a GPU refuses it; off unless
AttentionTuning.prefill_ws (BLINK_PREFILL_WS=1) and the block size fit.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from blink.kernels.attention_merge import NO_TILES
from blink.kernels.attention_plan import first_tile, grid_tiles, tile_sequence

WS_BLOCK_Q = 128  # query rows a program: two consumer warp groups of 64
# Session 28 (H200, Triton 3.6): the specialised kernel never finished; session 29 traced that to q's host
# descriptor (WS_Q_DESCS) and made q's descriptor in the kernel. Session 31 (H100, perf.md): no hang, and right on
# short steps (up to 5 KV tiles at 1-2 stages, 10 launches bit-equal), but wrong from 2,048 tokens (max error
# 0.14-0.93 at 1-5 stages; NaN and run-to-run differences at 3 stages and 5 tiles), while the interpreter's run of
# the same kernel on the same 2,048 + 6,144-token step matches the reference: the compiled pipeline is at fault
# (a K/V slot released before the wgmma that reads it is what the sm_90 PTX suggests, perf.md session 29). So a GPU
# refuses the specialised launch unless BLINK_PREFILL_WS_UNCHECKED=1 (for the GPU test and the bench).
WS_REFUSED = ("attention_ws: Triton 3.6's warp-specialised kernel returns wrong results on Hopper from 2k tokens "
              "(perf.md, session 31); unset BLINK_PREFILL_WS, or set BLINK_PREFILL_WS_UNCHECKED=1 to run it anyway")
WS_HEAD_DIMS = (64, 128)
WS_BLOCK_SIZES = (64, 128)


@triton.jit
def _ws_chunk_kernel(q_desc, k_desc, v_desc, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
                     scale_log2, stride_ot, stride_oh, stride_bt, num_seqs, num_tokens, stride_qt,
                     GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                     BLOCK_S: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, MASK_V_TAIL: tl.constexpr = False,
                     TABLE: tl.constexpr = 0, MAX_BLOCKS: tl.constexpr = 1, Q_ON_DEVICE: tl.constexpr = False):
    head = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)  # heaviest first, as attention.py's CAUSAL_SPLIT
    kv_head = head // GROUP
    seq = tile_sequence(tile, query_start_loc_ptr, num_seqs, BLOCK_Q, BLOCK_S)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    q_first = (tile - first_tile(q_start, seq, BLOCK_Q)) * BLOCK_Q
    context = seq_len - q_len
    # A tile past its sequence's queries runs no KV tile (a branch around the loop would stop the pass) and
    # stores nothing.
    kv_end = tl.minimum(seq_len, context + tl.minimum(q_first + BLOCK_Q, q_len))
    num_kv_tiles = tl.where(q_first < q_len, tl.cdiv(kv_end, BLOCK_N), 0)

    tokens = q_first + tl.arange(0, BLOCK_Q)
    q_pos = context + tokens
    if Q_ON_DEVICE:  # q_desc is q's pointer: a descriptor made here is one the pass can halve (WS_Q_DESCS)
        q_desc = tl.make_tensor_descriptor(q_desc, shape=[num_tokens, tl.num_programs(0) * D], strides=[stride_qt, 1],
                                           block_shape=[BLOCK_Q, D])
    q = q_desc.load([q_start + q_first, head * D])
    m_i = tl.full([BLOCK_Q], NO_TILES, tl.float32)  # finite: a row's masked tile leaves no NaN
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # How a tile finds its block (TABLE, for session 28's deadlock hunt; WS_TABLE_MODES): 0 a scalar load in the loop,
    # 1 the first entry plus the tile (contiguous tables only: a diagnostic), 2 the row read before the loop and
    # selected in registers (no load left in the loop)
    if TABLE == 1:
        first_block = tl.load(table_row)
    if TABLE == 2:
        entries = tl.arange(0, MAX_BLOCKS)
        row = tl.load(table_row + entries, mask=entries < num_kv_tiles, other=0)
    for kv_tile in tl.range(0, num_kv_tiles, warp_specialize=WARP_SPECIALIZE):
        if TABLE == 0:
            block = tl.load(table_row + kv_tile)
        elif TABLE == 1:
            block = first_block + kv_tile
        else:
            block = tl.sum(tl.where(entries == kv_tile, row, 0))
        k = k_desc.load([block, 0, kv_head, 0]).reshape(BLOCK_N, D)
        scores = tl.dot(q, k.T)
        k_pos = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        # causal: a valid row's keys end before kv_end, so the tile's tail past it is masked too
        scores = tl.where(k_pos[None, :] <= q_pos[:, None], scores, float("-inf"))
        # the maximum over raw scores, the scale inside exp2's FMA (attention_tile.py's SCALE_IN_EXP2)
        m_new = tl.maximum(m_i, tl.max(scores, 1) * scale_log2)
        p = tl.math.exp2(scores * scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([block, 0, kv_head, 0]).reshape(BLOCK_N, D)
        if MASK_V_TAIL:  # V's rows past kv_end zeroed: V then passes through registers (sm_90: 229 KB, spills)
            v = tl.where((k_pos < kv_end)[:, None], v, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    offs = (q_start + tokens).to(tl.int64)[:, None] * stride_ot + head * stride_oh + tl.arange(0, D)[None, :]
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=(tokens < q_len)[:, None])


def ws_chunk_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors: half-precision q and cache of one dtype, a head size it tiles, a block
    size of one KV tile, a GQA group, q's heads contiguous in a token (one 2-D box) and 16-byte aligned (TMA)."""
    _, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    elem = q.element_size()
    return (q.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype == q.dtype and head_dim in WS_HEAD_DIMS
            and block_size in WS_BLOCK_SIZES and num_q_heads % num_kv_heads == 0
            and q.stride(2) == 1 and q.stride(1) == head_dim and q.stride(0) * elem % 16 == 0
            and q.data_ptr() % 16 == 0 and k_cache.is_contiguous() and k_cache.data_ptr() % 16 == 0)


def ws_chunk_runs(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """ws_chunk_fits, on a device that has both TMA and Triton's Hopper pass (sm_90), or on the CPU, where the
    interpreter runs it for the tests (the pass needs sm_90 exactly: sm_100 takes another one, not tried here)."""
    if q.device.type == "cuda":
        return torch.cuda.get_device_capability(q.device)[0] == 9 and ws_chunk_fits(q, k_cache)
    return q.device.type == "cpu" and ws_chunk_fits(q, k_cache)


def ws_chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                       seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                       warp_specialize: bool = True, num_stages: int = 2, mask_v_tail: bool = False) -> torch.Tensor:
    """paged_attention's result for a step that ws_chunk_fits (rows of padding tokens unspecified, as there)."""
    if q.is_cuda and warp_specialize and os.environ.get("BLINK_PREFILL_WS_UNCHECKED") != "1":
        raise RuntimeError(WS_REFUSED)
    return launch_ws_chunk(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, warp_specialize,
                           num_stages, mask_v_tail, q_desc="device")


WS_TABLE_MODES = {"load": 0, "contiguous": 1, "row": 2}  # the kernel's TABLE
# Where q's TMA descriptor is made: the likely cause of session 28's hang, read from the sm_90 PTX on the CPU. The
# pass halves q's load between the two consumer groups (two [BLOCK_Q / 2, D] copies, each barrier's expect_tx half
# the tile), but a host descriptor's box is fixed at [BLOCK_Q, D] (the launcher encodes the box in the kernel's
# metadata, still 128 rows): each copy lands twice the bytes its mbarrier expects, so its tx-count passes zero and
# the consumer groups' wait on q never ends. "device": the kernel makes the descriptor (tl.make_tensor_descriptor),
# so the split halves its box too (PTX box 64 rows = expect_tx). Triton's Hopper attention tutorial does so for this
# reason (triton-lang/triton PR 7658: no data partitioning with host TMA on Hopper; issue 11587 / PR 11596: a later
# Triton's verifier rejects the mismatch at compile time, 3.6 compiles it).
WS_Q_DESCS = ("host", "device")


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch for Triton's in-kernel descriptors (128 bytes a program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """A device descriptor needs a scratch allocator (triton.set_allocator); one already set is kept."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def launch_ws_chunk(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, warp_specialize: bool = True,
                    num_stages: int = 2, mask_v_tail: bool = False, table: str = "load", q_desc: str = "host",
                    block_q: int = WS_BLOCK_Q) -> torch.Tensor:
    """The launch without ws_chunk_attention's refusal, for the deadlock diagnosis (tools/diag_ws.py) and the tests.
    table "contiguous" is right only where each sequence's blocks are consecutive. q_desc: WS_Q_DESCS. block_q 64:
    a diagnostic control (the pass then leaves q whole: both consumer groups run the same 64 rows)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    assert ws_chunk_fits(q, k_cache) and v_cache.stride() == k_cache.stride() and block_tables.stride(-1) == 1
    assert q_desc in WS_Q_DESCS and block_q in (64, WS_BLOCK_Q)
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(q)
    if q_desc == "device":
        q_arg = q  # its pointer; the kernel makes the descriptor
        if q.is_cuda:
            _ensure_allocator()
    else:
        q_arg = TensorDescriptor.from_tensor(q.view(num_tokens, num_q_heads * head_dim), [block_q, head_dim])
    kv_box = [1, block_size, 1, head_dim]
    k_desc = TensorDescriptor.from_tensor(k_cache, kv_box)
    v_desc = TensorDescriptor.from_tensor(v_cache, kv_box)
    grid = (num_q_heads, grid_tiles(num_tokens, num_seqs, block_q))
    _ws_chunk_kernel[grid](q_arg, k_desc, v_desc, out, query_start_loc, seq_lens, block_tables,
                           scale * 1.4426950408889634, out.stride(0), out.stride(1), block_tables.stride(0), num_seqs,
                           num_tokens, q.stride(0), GROUP=num_q_heads // num_kv_heads, BLOCK_Q=block_q,
                           BLOCK_N=block_size, D=head_dim, BLOCK_S=triton.next_power_of_2(num_seqs),
                           WARP_SPECIALIZE=warp_specialize, MASK_V_TAIL=mask_v_tail, TABLE=WS_TABLE_MODES[table],
                           MAX_BLOCKS=triton.next_power_of_2(block_tables.shape[1]), Q_ON_DEVICE=q_desc == "device",
                           num_warps=4, num_stages=num_stages)
    return out
