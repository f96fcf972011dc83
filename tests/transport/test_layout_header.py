"""blink/control/csrc/layout.h must match blink/transport/layout.py field by field.

A C++ program generated from the ctypes definitions prints offset, size and kind (float / signed /
unsigned) of every field as the compiler sees them: a field missing, moved, resized or retyped on either
side fails here (a field only in C++ cannot hide either: the Python structs have no implicit padding,
so every byte is some named field, and sizeof is checked).
"""
import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest

from blink.request import FinishReason
from blink.transport import layout

HEADER_DIR = Path(__file__).resolve().parents[2] / "blink" / "control" / "csrc"
STRUCTS = [layout.ControlBlock, layout.RingHeader, layout.RequestDescriptor, layout.TokenRecord]
CAPACITIES = [(1, 1, 1), (64, 4096, 256), (1000, 123457, 999), (4096, 1 << 20, 8192)]
CONSTANTS = {
    "kMagic": layout.MAGIC, "kVersion": layout.VERSION, "kCacheLine": layout.CACHE_LINE, "kPage": layout.PAGE,
    "kMaxStopIds": layout.MAX_STOP_IDS, "kMaxTopLogprobs": layout.MAX_TOP_LOGPROBS,
    "kKindRequest": layout.KIND_REQUEST, "kKindAbort": layout.KIND_ABORT,
    "kFlagIgnoreEos": layout.FLAG_IGNORE_EOS, "kFlagConstraint": layout.FLAG_CONSTRAINT,
    "kEngineModeNone": layout.ENGINE_MODE_NONE, "kEngineModeHost": layout.ENGINE_MODE_HOST,
    "kEngineModeDevice": layout.ENGINE_MODE_DEVICE,
    **{f"kFinish{reason.name.title()}": int(reason) for reason in FinishReason},
}
SECTIONS = ["control", "ingress_header", "ingress_records", "arena_header", "arena_data", "egress_header",
            "egress_records", "size"]

PRELUDE = """
#include <cstdio>
#include <type_traits>
#include "layout.h"
template <class T> char kind_of() {
  using E = typename std::remove_all_extents<T>::type;
  return std::is_floating_point<E>::value ? 'f' : std::is_signed<E>::value ? 'i' : 'u';
}
#define FIELD(S, f) std::printf("%s.%s %zu %zu %c\\n", #S, #f, offsetof(blink::S, f), \\
    sizeof(blink::S::f), kind_of<decltype(blink::S::f)>())
int main() {
"""


def ctypes_kind(ctype) -> str:
    while hasattr(ctype, "_length_"):  # arrays: their element type
        ctype = ctype._type_
    code = ctype._type_
    return "f" if code in "fd" else "u" if code.isupper() else "i"


def expected_lines() -> list[str]:
    lines = []
    for struct in STRUCTS:
        for name, ctype in struct._fields_:
            field = getattr(struct, name)
            lines.append(f"{struct.__name__}.{name} {field.offset} {field.size} {ctypes_kind(ctype)}")
        lines.append(f"sizeof {struct.__name__} {C.sizeof(struct)}")
    lines += [f"const {name} {value}" for name, value in CONSTANTS.items()]
    for caps in CAPACITIES:
        seg = layout.SegmentLayout(*caps)
        lines += [f"layout {caps} {name} {getattr(seg, name)}" for name in SECTIONS]
    return lines


def program() -> str:
    body = []
    for struct in STRUCTS:
        body += [f"  FIELD({struct.__name__}, {name});" for name, _ in struct._fields_]
        body.append(f'  std::printf("sizeof {struct.__name__} %zu\\n", sizeof(blink::{struct.__name__}));')
    body += [f'  std::printf("const {name} %llu\\n", (unsigned long long)blink::{name});'
             for name in CONSTANTS]
    for caps in CAPACITIES:
        body.append(f"  {{ constexpr blink::SegmentLayout s{{{caps[0]}, {caps[1]}, {caps[2]}}};")
        body += [f'    std::printf("layout {caps} {name} %llu\\n", (unsigned long long)s.{name}());'
                 for name in SECTIONS]
        body.append("  }")
    return PRELUDE + "\n".join(body) + "\n  return 0;\n}\n"


def test_python_structs_have_no_implicit_padding():
    for struct in STRUCTS:
        assert sum(getattr(struct, name).size for name, _ in struct._fields_) == C.sizeof(struct), struct


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_header_matches_ctypes(tmp_path):
    source = tmp_path / "layout_dump.cpp"
    source.write_text(program())
    binary = tmp_path / "layout_dump"
    compile_cmd = ["g++", "-std=c++17", "-Wall", "-Werror", f"-I{HEADER_DIR}", str(source), "-o", str(binary)]
    subprocess.run(compile_cmd, check=True, capture_output=True, text=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.splitlines()
    assert printed == expected_lines()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_header_compiles_for_cuda(tmp_path):
    source = tmp_path / "use_layout.cu"
    source.write_text('#include "layout.h"\n'
                      "__global__ void touch(blink::RingHeader* h, blink::SegmentLayout s) {\n"
                      "  h->tail = s.egress_records() + blink::kMaxTopLogprobs;\n}\n")
    compile_cmd = ["nvcc", "-std=c++17", f"-I{HEADER_DIR}", "-c", str(source), "-o", str(tmp_path / "u.o")]
    subprocess.run(compile_cmd, check=True, capture_output=True, text=True)
