"""blink/device/csrc/layout.h must match blink/transport/layout.py field by field (tests/abi_dump.py):
every field's offset, size and kind, every sizeof, every constant and the section offsets of a segment."""
import bisect
import ctypes as C
import shutil

import pytest

from blink import request
from blink.request import FinishReason
from blink.transport import layout
from tests.abi_dump import AbiDump, padding_holes

STRUCTS = [layout.ControlBlock, layout.RingHeader, layout.RequestDescriptor, layout.TokenRecord]
CAPACITIES = [(1, 1, 1), (64, 4096, 256), (1000, 123457, 999), (4096, 1 << 20, 8192),
              (64, 4096, 256, layout.GRAMMAR_SLOTS, 1), (8, 1000, 9, layout.GRAMMAR_SLOTS, (64 << 20) // 64)]
CONSTANTS = {
    "kMagic": layout.MAGIC, "kVersion": layout.VERSION, "kCacheLine": layout.CACHE_LINE, "kPage": layout.PAGE,
    "kMaxStopIds": request.MAX_STOP_TOKEN_IDS, "kMaxTopLogprobs": request.MAX_TOP_LOGPROBS,
    "kKindRequest": layout.KIND_REQUEST, "kKindAbort": layout.KIND_ABORT,
    "kMaxPublishedBuckets": layout.MAX_PUBLISHED_BUCKETS,
    "kFlagIgnoreEos": layout.FLAG_IGNORE_EOS, "kFlagConstraint": layout.FLAG_CONSTRAINT,
    "kEngineModeNone": layout.ENGINE_MODE_NONE, "kEngineModeHost": layout.ENGINE_MODE_HOST,
    "kEngineModeDevice": layout.ENGINE_MODE_DEVICE, "kGrammarSlots": layout.GRAMMAR_SLOTS,
    **{f"kFinish{reason.name.title()}": int(reason) for reason in FinishReason},
}
SECTIONS = ["control", "ingress_header", "ingress_records", "arena_header", "arena_data", "egress_header",
            "egress_records", "grammar_staging", "size"]


def section_dump() -> tuple[list[str], list[str]]:
    """(C++ statements, expected lines) for the section offsets of a few segment sizes."""
    code, lines = [], []
    for caps in CAPACITIES:
        seg = layout.SegmentLayout(*caps)
        code.append(f"{{ constexpr blink::SegmentLayout s{{{', '.join(map(str, caps))}}};")
        code += [f'  std::printf("layout {caps} {name} %llu\\n", (unsigned long long)s.{name}());' for name in SECTIONS]
        code.append("}")
        lines += [f"layout {caps} {name} {getattr(seg, name)}" for name in SECTIONS]
    return code, lines


def bucket_dump() -> tuple[list[str], list[str]]:
    """(C++ statements, expected lines) for the two /metrics histograms' bucket functions at and around every
    bound: iteration_bucket (tokens per step) and step_interval_bucket (ns)."""
    code, lines = [], []
    for name, fn, bounds in (("iteration_bucket", lambda n: bisect.bisect_left(layout.ITERATION_TOKEN_BOUNDS, n),
                              layout.ITERATION_TOKEN_BOUNDS),
                             ("step_interval_bucket", layout.step_interval_bucket, layout.STEP_INTERVAL_BOUNDS_NS)):
        for value in sorted({0, 1, *(b + d for b in bounds for d in (-1, 0, 1)), 10 * bounds[-1]}):
            code.append(f'std::printf("{name} {value} %d\\n", blink::{name}({value}));')
            lines.append(f"{name} {value} {fn(value)}")
    return code, lines


def dump() -> AbiDump:
    code, lines = section_dump()
    more_code, more_lines = bucket_dump()
    return AbiDump("layout.h", STRUCTS, CONSTANTS, code + more_code, lines + more_lines)


def test_python_structs_have_no_implicit_padding():
    for struct in STRUCTS:
        assert padding_holes(struct) == 0, struct
    assert C.sizeof(layout.TokenRecord) % 16 == 0


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_header_matches_ctypes(tmp_path):
    assert dump().run("g++", tmp_path) == dump().expected()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.timeout(300)
def test_header_matches_ctypes_under_nvcc(tmp_path):
    assert dump().run("nvcc", tmp_path) == dump().expected()
