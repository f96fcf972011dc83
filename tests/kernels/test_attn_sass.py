"""tools/attn_sass.py reads a decode variant's registers and spills from Triton's own ptxas, on this CPU machine:
the register cap a tuning asks for (decode_maxnreg) must reach the compile, or its bench row would time the
default under another name."""
import re

import pytest

from tests.kernels.sm90 import run_uninterpreted

pytestmark = pytest.mark.slow  # compiles for sm_90 in a subprocess

ROW = re.compile(r"^(.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S*/")  # name, shared memory, registers, stack; then loops


def test_decode_rows_show_the_register_cap():
    out = run_uninterpreted(["-m", "tools.attn_sass", "--decode-batch", "32", "--variants", "default;maxnreg 96"],
                            timeout=300)
    rows = {m.group(1): [int(x) for x in m.groups()[1:]] for m in map(ROW.match, out.splitlines()) if m}
    assert set(rows) == {"default", "maxnreg 96"}, out
    smem, regs, _ = rows["maxnreg 96"]
    assert regs <= 96 and smem == rows["default"][0]
    assert rows["default"][1] > 96  # uncapped, batch 32's grid takes more: the cap changed the compile


def test_the_gathered_page_reaches_the_compile():
    """prefill_page_gather (session 31, the default since session 33): at 16-token blocks a 128-key chunk tile loads
    its 8 table entries at once, so its loops issue the cp.async count of a 128-token block's tile (one entry), not
    one entry a key's (one a key's 16); the default ("today") compiles the gathered loop."""
    out = run_uninterpreted(["-m", "tools.attn_sass", "--variants", "one-entry;today-gather;today;today-b128"],
                            timeout=300)
    ldgsts = {}
    for line in out.splitlines():
        if m := ROW.match(line):
            loops = line.split()[4:]  # per loop: ins/MUFU.EX2/FMUL/FFMA/FADD/BAR.SYNC/LDGSTS/...
            ldgsts[m.group(1)] = [int(loop.split("/")[6]) for loop in loops]
    assert ldgsts["today-gather"] == ldgsts["today-b128"] == ldgsts["today"], out
    assert all(a > b for a, b in zip(ldgsts["one-entry"], ldgsts["today-gather"], strict=True)), out
