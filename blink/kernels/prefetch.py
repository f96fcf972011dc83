"""L2 prefetches from Triton kernels, for work done before a PDL wait (pdl.py): lines a kernel will read once the
previous kernel has finished, fetched into L2 while it finishes. Nothing waits for a prefetch and no register
holds its data, so a kernel's first loads after the wait hit L2 without lengthening anything. Used by attention's
early table (attention_tile.py); session 25 measured it before the GEMV's wait too and removed it (perf.md)."""
from __future__ import annotations

import os

import triton
import triton.language as tl

# inline PTX does not run under the interpreter; the kernels leave their prefetches out there (results are the same)
CAN_PREFETCH = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def prefetch_l2(ptrs, mask):
    """prefetch.global.L2 of each masked-in address. Not pure, so it is kept although its dummy result is unused;
    the predicate keeps masked-out (possibly invalid) addresses from being touched."""
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                              "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
