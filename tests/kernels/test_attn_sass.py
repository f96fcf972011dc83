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
