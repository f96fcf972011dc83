"""Issue 17's early table (AttentionTuning.early_table): decode tiles warm their first KV tile before the PDL wait.
The interpreter runs the table part (the L2 prefetch is inline assembly, compiled only), so there the outputs must be
the same bits as without it; compiled for sm_90 the prefetch must be emitted, fed by a block-table load that comes
before griddepcontrol.wait."""
import json
import re

import pytest
import torch
import triton
import triton.language as tl

from blink.kernels import attention
from blink.kernels.attention import _warm_first_kv_tile, paged_attention_ref, paged_attention_triton
from blink.kernels.attention_plan import AttentionTuning, launch_plan
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.sm90 import run_uninterpreted

BLOCK = 16
EARLY = AttentionTuning(early_table=True)


def test_the_plan_takes_the_early_table_for_decode_tiles_only():
    assert not launch_plan(8, 8, 32, 8, 128, 1024, AttentionTuning()).early_table  # off by default
    assert launch_plan(8, 8, 32, 8, 128, 1024, EARLY).early_table
    assert launch_plan(1, 1, 32, 8, 128, 32768, EARLY).early_table  # batch 1's grid, splits counted in the kernel
    assert not launch_plan(128, 64, 32, 8, 128, 1024, EARLY).early_table  # a bucket that carries a chunk


def _launch_spy(monkeypatch):
    """Records the constexprs of each attention launch, then launches as before."""
    real, seen = attention._paged_attention_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append({k: kwargs[k] for k in ("EARLY_TABLE", "PREFETCH_KV", "NUM_SPLITS", "SPLIT_MIN_TILES")})
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(attention, "_paged_attention_kernel", Spy())
    return seen


# (q_lens, seq_lens, padding rows, tuning knobs, num_splits): decodes at batch 1 / 8 / 32 (one split and several,
# splits counted in the kernel), and a chunk continuing its context inside a decode bucket (tokens <= rows)
CASES = [([1], [300], 0, {}, None), ([1], [300], 0, dict(split_min_tiles=2, max_grid_splits=16), None),
         ([1] * 8, [1, 17, 300, 64, 129, 33, 250, 16], 2, {}, None), ([1] * 8, [90] * 8, 0, {}, 4),
         ([1] * 32, [5 + 7 * i for i in range(32)], 0, {}, None), ([6, 1, 1], [40, 17, 70], 6, {}, None),
         ([6, 1, 1], [40, 17, 70], 6, {}, 2)]


@pytest.mark.parametrize("q_lens,seq_lens,pad_seqs,knobs,num_splits", CASES)
def test_the_early_table_changes_no_bit(monkeypatch, q_lens, seq_lens, pad_seqs, knobs, num_splits):
    batch = make_paged_batch(q_lens, seq_lens, 8, 2, head_dim=32, block_size=BLOCK, pad_seqs=pad_seqs,
                             pad_tokens=min(pad_seqs, 1))
    if pad_seqs:  # a padding row with a stale length and table: its programs must warm nothing (masked)
        batch.seq_lens[len(seq_lens)] = 250
        batch.block_tables[len(seq_lens)] = batch.block_tables[0]
    seen = _launch_spy(monkeypatch)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, 0.2)
    outs = [paged_attention_triton(*args, num_splits=num_splits, tuning=AttentionTuning(early_table=early, **knobs))
            for early in (False, True)]
    assert [launch["EARLY_TABLE"] for launch in seen] == [False, True]
    assert not any(launch["PREFETCH_KV"] for launch in seen)  # no inline assembly under the interpreter
    assert seen[0]["NUM_SPLITS"] == seen[1]["NUM_SPLITS"] and (num_splits is None or seen[0]["NUM_SPLITS"] > 1)
    n = batch.num_real_tokens
    assert torch.equal(outs[0][:n], outs[1][:n])
    torch.testing.assert_close(outs[1][:n], paged_attention_ref(*args)[:n], atol=2e-5, rtol=2e-5)


@triton.jit
def _warm_probe(cached_ptr, offs_ptr, block_tables_ptr, k_ptr, seq, seq_len, q_len, q_first, split, kv_head,
                stride_bt, block_size, stride_cb, stride_co, stride_ch, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                NUM_SPLITS: tl.constexpr, SPLIT_MIN_TILES: tl.constexpr, PAGE: tl.constexpr):
    cached, offs = _warm_first_kv_tile(seq, seq_len, q_len, q_first, split, block_tables_ptr, stride_bt, k_ptr, k_ptr,
                                       kv_head, 32, block_size, stride_cb, stride_co, stride_ch, BLOCK_Q, BLOCK_N, 32,
                                       NUM_SPLITS, SPLIT_MIN_TILES, PAGE, False)
    keys = tl.arange(0, BLOCK_N)
    tl.store(cached_ptr + keys, cached.to(tl.int32))
    tl.store(offs_ptr + keys, offs)


# (seq_len, q_len, q_first, split, splits, split_min_tiles, page) -> the positions it warms (32-key tiles, 16 queries)
WARM_CASES = [((300, 1, 0, 3, 4, 0, 0), range(288, 299)),  # 10 tiles in 4 splits of 3: the last tile, 11 cached
              ((300, 1, 0, 3, 4, 0, 16), range(288, 299)),  # the block size compiled in
              ((300, 1, 0, 0, 1, 0, 0), range(0, 32)),
              ((100, 40, 32, 0, 1, 0, 0), range(0, 32)),  # a chunk's second query tile: context 60
              ((100, 40, 32, 1, 2, 0, 0), range(0)),  # its second split starts at 64: past the context
              ((100, 40, 48, 0, 1, 0, 0), range(0)),  # a tile past the chunk's queries
              ((40, 40, 0, 0, 1, 0, 0), range(0)),  # a prompt from scratch: nothing cached
              ((200, 1, 0, 1, 8, 2, 0), range(96, 128)),  # 7 tiles keep 3 splits of 3 tiles: the second
              ((200, 1, 0, 3, 8, 2, 0), range(0))]  # a split past the sequence's own count


@pytest.mark.parametrize("shape,positions", WARM_CASES)
def test_the_warmed_tile_is_the_loops_first_below_the_context(shape, positions):
    seq_len, q_len, q_first, split, splits, min_tiles, page = shape
    block_tables = torch.randperm(64 * 3, generator=torch.Generator().manual_seed(0)).to(torch.int32).reshape(3, 64)
    k = torch.zeros(8)  # never read: no prefetch under the interpreter
    cached, offs = torch.full((32,), -1, dtype=torch.int32), torch.full((32,), -1, dtype=torch.int64)
    strides = (BLOCK * 4 * 32, 4 * 32, 32)  # [blocks, BLOCK, 4 kv heads, 32]; row 1 of the table, kv head 2
    _warm_probe[(1,)](cached, offs, block_tables, k, 1, seq_len, q_len, q_first, split, 2, 64, BLOCK, *strides,
                      BLOCK_Q=16, BLOCK_N=32, NUM_SPLITS=splits, SPLIT_MIN_TILES=min_tiles, PAGE=page)
    first_key = positions.start // 32 * 32
    assert cached.tolist() == [int(first_key + i in positions) for i in range(32)]
    for i, p in enumerate(range(first_key, first_key + 32)):
        if p in positions:
            block = int(block_tables[1, p // BLOCK])
            assert int(offs[i]) == block * strides[0] + (p % BLOCK) * strides[1] + 2 * strides[2], (i, p)


def _trace(ptx: str, table_param: str) -> dict:
    """What the PTX does before griddepcontrol.wait: loads through the block-table pointer, and prefetches whose
    address derives from a value such a load returned (register dataflow, one pass: the PTX is in order)."""
    head = ptx[:ptx.index("griddepcontrol.wait")]
    pointer, loaded, table_loads, fed = set(), set(), 0, 0
    for line in head.splitlines():
        regs = re.findall(r"%[a-z]+\d+", line.split("//")[0])
        if "prefetch.global.L2" in line:
            fed += bool(set(re.findall(r"\[(%rd\d+)\]", line)) & loaded)
        elif "ld.param" in line and regs:
            pointer.discard(regs[0])
            if line.rstrip().endswith(f"{table_param}];"):
                pointer.add(regs[0])
        elif "ld.global" in line and regs:
            address = re.search(r"\[\s*(%rd\d+)", line).group(1)
            dst = regs[1] if regs[0].startswith("%p") else regs[0]
            table_loads += address in pointer
            (loaded.add if address in pointer or address in loaded else loaded.discard)(dst)
        elif len(regs) > 1 and not line.lstrip().startswith(("@", "{")):
            for taint in (pointer, loaded):
                (taint.add if set(regs[1:]) & taint else taint.discard)(regs[0])
    return {"prefetches": ptx.count("prefetch.global.L2"), "table_loads_before_wait": table_loads,
            "prefetches_fed_by_the_table": fed, "waits": ptx.count("griddepcontrol.wait")}


def _compile_variants() -> dict:
    from tools.attn_sass import compile_variant

    arg_names = [n for n in attention._paged_attention_kernel.arg_names if n[0].islower()]  # the runtime arguments
    table_param = f"_paged_attention_kernel_param_{arg_names.index('block_tables_ptr')}"
    found = {}
    for batch, kv_len in [(1, 1024), (1, 32768), (8, 1024), (32, 1024)]:  # llama3-8b's heads, as the step runs them
        for name, tuning in [("default", AttentionTuning()), ("early", EARLY)]:
            kernel = compile_variant(tuning, batch, batch, kv_len, pdl=True)
            found[f"b{batch} {kv_len} {name}"] = _trace(kernel.asm["ptx"], table_param)
    return found


@pytest.mark.slow  # compiles for sm_90 in a subprocess
def test_compiled_the_early_variant_prefetches_from_a_table_load_before_the_wait():
    found = json.loads(run_uninterpreted([__file__], timeout=400).strip().splitlines()[-1])
    assert len(found) == 8, found
    for label, trace in found.items():
        assert trace["waits"] == 1, (label, trace)
        if label.endswith("default"):
            assert trace["prefetches"] == 0 and trace["table_loads_before_wait"] == 0, (label, trace)
        else:  # K and V, one prefetch each a thread's (key, line), both from the table's entries
            assert trace["prefetches"] >= 2 and trace["prefetches_fed_by_the_table"] == trace["prefetches"], (label,
                                                                                                           trace)
            assert trace["table_loads_before_wait"] >= 1, (label, trace)


if __name__ == "__main__":
    print(json.dumps(_compile_variants()))
