"""The decode-attention variants the benches weigh against the default (step_kernels.py times each alone,
fusion.py some of them in the whole step): every row a change of AttentionTuning, named by what it changes and,
where it was once the default, by the session that replaced it."""
from __future__ import annotations

import argparse

from blink.kernels.attention_plan import AttentionTuning

PREVIOUS_ATTENTION = "before session 13 (stages 3, split < 1/SM)"
BEFORE_SESSION_13 = AttentionTuning(num_stages=3, split_below_per_sm=1, small_grid_programs=None)
HOST_SPLITS = AttentionTuning(small_grid_split_min_tiles=None)  # session 15: the host's split count at batch 1 too
ATTENTION_VARIANTS = {  # sessions 13 and 16 set decode's stages, split rule and batch-1 tiles from these rows
    "default": AttentionTuning(),
    "merge kernel (before session 19)": AttentionTuning(merge_in_kernel=False),
    "batch 1 without the block size compiled in (before session 19)": AttentionTuning(small_grid_const_page=False),
    "block size compiled in (session 18)": AttentionTuning(decode_const_page=True),
    "gather": AttentionTuning(decode_const_page=True, decode_page_gather=True),
    "gather, maxnreg 128": AttentionTuning(decode_const_page=True, decode_page_gather=True, decode_maxnreg=128),
    "block size compiled in + exp2 scale (session 18)": AttentionTuning(decode_const_page=True,
                                                                        decode_scale_in_exp2=True),
    PREVIOUS_ATTENTION: BEFORE_SESSION_13,
    "host split count at batch 1 (session 15)": HOST_SPLITS,
    "stages 3": AttentionTuning(num_stages=3),
    "split < 1/SM": AttentionTuning(split_below_per_sm=1),
    "no small grid (n64, 16 splits at batch 1)": AttentionTuning(small_grid_programs=None),
    "n32, 64 splits at batch 1": AttentionTuning(small_grid_max_splits=64, small_grid_split_min_tiles=None),
    "n64, 8 warps": AttentionTuning(num_warps=8),
    # session 19: batch 8 reads 33.5 MB a layer at 2.4 TB/s in 8 splits of 2 KV tiles; fatter or thinner programs
    "n128 (decode)": AttentionTuning(block_n=128),
    "n32 (decode)": AttentionTuning(block_n=32),
    "2 programs/SM (fewer splits)": AttentionTuning(programs_per_sm=2),
    "6 programs/SM (more splits)": AttentionTuning(programs_per_sm=6),
    "n128, stages 3": AttentionTuning(block_n=128, num_stages=3),
    # batch 32 / 64 at 1k: 512 programs (3 an SM fit: 1.3 waves) read at 2.9-3.1 TB/s; more splits even the waves
    "unsplit: 2 stages (before session 19)": AttentionTuning(unsplit_num_stages=2),
    "unsplit: 4 stages": AttentionTuning(unsplit_num_stages=4),
    "2 warps": AttentionTuning(num_warps=2),  # more programs an SM where registers limit them (ncu at batch 64)
    "maxnreg 128": AttentionTuning(decode_maxnreg=128),
    "maxnreg 128, unsplit 2 stages": AttentionTuning(decode_maxnreg=128, unsplit_num_stages=2),
    # batch 32's split grid (ncu, session 20): 128 registers and 38.9 KB of shared memory both hold it to 4 programs
    # an SM at 0.45 eligible warps a scheduler; at 96 registers the shared memory allows 5
    "maxnreg 96": AttentionTuning(decode_maxnreg=96),
    "split < 4/SM, 4/SM": AttentionTuning(split_below_per_sm=4, programs_per_sm=4),
    "split < 4/SM, 8/SM": AttentionTuning(split_below_per_sm=4, programs_per_sm=8),
    "split < 8/SM, 12/SM": AttentionTuning(split_below_per_sm=8, programs_per_sm=12),
    # issue 17: the first KV tile's block-table entries and an L2 prefetch of its cached K/V before the PDL wait (only
    # launches with PDL overlap them with the kernel before; alone it times the extra loads)
    "early table": AttentionTuning(early_table=True),
}
# Splits counted in the kernel from each sequence's length at every decode batch, the grid sized for the longest
# (the default does so at batch 1 only). "N/SM": the grid's target programs per SM (batch 8: 6/SM -> 16 splits).
ATTENTION_VARIANTS.update({f"dyn splits: min {tiles} tiles, up to {grid}" + (f", {per_sm}/SM" if per_sm else ""):
                           AttentionTuning(split_min_tiles=tiles, max_grid_splits=grid, grid_programs_per_sm=per_sm)
                           for tiles, grid, per_sm in [(4, 64, None), (2, 64, 6)]})


def chosen_names(parser: argparse.ArgumentParser, spec: str | None, table: dict, what: str) -> list[str]:
    """The names of a bench table's rows that `spec` picks: ';' between them (some names hold commas), None or "all"
    for every row. An unknown name is the parser's error, before any GPU time is spent."""
    if spec in (None, "all"):
        return list(table)
    names = spec.split(";")
    if unknown := [name for name in names if name not in table]:
        parser.error(f"unknown {what} {unknown}; known: {list(table)}")
    return names
