"""Checks a C++ header against its ctypes mirrors field by field, as the compiler sees it.

`AbiDump` generates a C++ program from the ctypes definitions that prints, for every field, its offset,
size, kind (f float, i signed, u unsigned, p pointer, s struct) and element size (arrays: one element);
for a nested struct whether it is the C++ struct of the same name; for a pointer whose struct declares a
pointee in `_pointees_` (ctypes type, Structure subclass, or None = opaque) the pointee's size and kind;
then every struct's sizeof and every constant's value. The test compiles it (g++; nvcc -x cu, which
also checks offsets, sizes and kinds as static_asserts in its device passes), runs it on the CPU and compares
the printed lines with `expected()`: a field missing, moved, resized, retyped or swapped with one of the
same size fails, and with no implicit padding on the Python side (`padding_holes`) no C++-only field
can hide either, since sizeof is checked.
"""
from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "blink" / "device" / "csrc"

PRELUDE = r"""
#include <cstddef>
#include <cstdio>
#include <type_traits>
#include "{header}"
template <class T> using elem_t = typename std::remove_all_extents<T>::type;
template <class T> using pointee_t = typename std::remove_cv<typename std::remove_pointer<elem_t<T>>::type>::type;
template <class T> constexpr char kind_of() {{
  return std::is_pointer<T>::value ? 'p' : std::is_class<T>::value ? 's' : std::is_floating_point<T>::value ? 'f'
       : std::is_signed<T>::value ? 'i' : 'u';
}}
template <class T> void print_const(const char* name, T v) {{
  if (std::is_signed<T>::value) std::printf("const %s %lld\n", name, (long long)v);
  else std::printf("const %s %llu\n", name, (unsigned long long)v);
}}
#define M(S, f) decltype(blink::S::f)
#define E(S, f) elem_t<M(S, f)>
#define P(S, f) pointee_t<M(S, f)>
#define FIELD(S, f) std::printf("%s.%s %zu %zu %c %zu\n", #S, #f, offsetof(blink::S, f), sizeof(M(S, f)), \
    kind_of<E(S, f)>(), sizeof(E(S, f)))
#define ELEM_IS(S, f, N) std::printf("%s.%s elem %s %d\n", #S, #f, #N, (int)std::is_same<E(S, f), blink::N>::value)
#define POINTEE(S, f) std::printf("%s.%s -> %zu %c\n", #S, #f, sizeof(P(S, f)), kind_of<P(S, f)>())
#define POINTEE_IS(S, f, N) std::printf("%s.%s -> %s %d\n", #S, #f, #N, (int)std::is_same<P(S, f), blink::N>::value)
#define SIZEOF(S) std::printf("sizeof %s %zu\n", #S, sizeof(blink::S))
"""


def _element(ctype):
    while hasattr(ctype, "_length_") and not _is_pointer(ctype):  # arrays: their element type
        ctype = ctype._type_
    return ctype


def _is_pointer(ctype) -> bool:
    return ctype is C.c_void_p or (isinstance(ctype, type) and issubclass(ctype, C._Pointer))


def ctypes_kind(ctype) -> str:
    ctype = _element(ctype)
    if _is_pointer(ctype):
        return "p"
    if issubclass(ctype, C.Structure):
        return "s"
    code = ctype._type_
    return "f" if code in "fd" else "u" if code.isupper() or code == "?" else "i"


def padding_holes(struct) -> int:
    """Bytes of `struct` that no field covers (implicit padding, where a C++-only field could hide)."""
    return C.sizeof(struct) - sum(getattr(struct, name).size for name, *_ in struct._fields_)


@dataclass
class AbiDump:
    header: str  # file name under include_dir
    structs: Sequence[type]
    constants: Mapping[str, int] = field(default_factory=dict)  # C++ name (namespace blink) -> value
    extra_code: Sequence[str] = ()  # further C++ statements that print one line each...
    extra_lines: Sequence[str] = ()  # ...and the lines they must print
    include_dir: Path = CSRC

    def expected(self) -> list[str]:
        lines = []
        for struct in self.structs:
            s = struct.__name__
            for name, ctype in struct._fields_:
                f, elem = getattr(struct, name), _element(ctype)
                lines.append(f"{s}.{name} {f.offset} {f.size} {ctypes_kind(ctype)} {C.sizeof(elem)}")
                if ctypes_kind(ctype) == "s":
                    lines.append(f"{s}.{name} elem {elem.__name__} 1")
                pointee = self._pointee(struct, name, ctype)
                if pointee is not None:
                    lines.append(f"{s}.{name} -> {C.sizeof(pointee)} {ctypes_kind(pointee)}")
                    if ctypes_kind(pointee) == "s":
                        lines.append(f"{s}.{name} -> {pointee.__name__} 1")
            lines.append(f"sizeof {s} {C.sizeof(struct)}")
        lines += [f"const {name} {value}" for name, value in self.constants.items()]
        return lines + list(self.extra_lines)

    def program(self) -> str:
        body, asserts = [], []
        for struct in self.structs:
            s = struct.__name__
            for name, ctype in struct._fields_:
                f, elem = getattr(struct, name), _element(ctype)
                body.append(f"FIELD({s}, {name});")
                asserts.append(f"static_assert(offsetof(blink::{s}, {name}) == {f.offset} && "
                               f"sizeof(M({s}, {name})) == {f.size} && sizeof(elem_t<M({s}, {name})>) == "
                               f"{C.sizeof(elem)} && kind_of<elem_t<M({s}, {name})>>() == '{ctypes_kind(ctype)}', "
                               f"\"{s}.{name}: offset, size or kind\");")
                if ctypes_kind(ctype) == "s":
                    body.append(f"ELEM_IS({s}, {name}, {elem.__name__});")
                    asserts.append(f"static_assert(std::is_same<E({s}, {name}), blink::{elem.__name__}>::value, "
                                   f"\"{s}.{name}: struct type\");")
                pointee = self._pointee(struct, name, ctype)
                if pointee is not None:
                    body.append(f"POINTEE({s}, {name});")
                    asserts.append(f"static_assert(sizeof(pointee_t<M({s}, {name})>) == {C.sizeof(pointee)} && "
                                   f"kind_of<pointee_t<M({s}, {name})>>() == '{ctypes_kind(pointee)}', "
                                   f"\"{s}.{name}: pointee size or kind\");")
                    if ctypes_kind(pointee) == "s":
                        body.append(f"POINTEE_IS({s}, {name}, {pointee.__name__});")
                        asserts.append(f"static_assert(std::is_same<pointee_t<M({s}, {name})>, "
                                       f"blink::{pointee.__name__}>::value, \"{s}.{name}: pointee type\");")
            body.append(f"SIZEOF({s});")
            asserts.append(f"static_assert(sizeof(blink::{s}) == {C.sizeof(struct)}, \"sizeof {s}\");")
        body += [f'print_const("{name}", blink::{name});' for name in self.constants]
        asserts += [f"static_assert((long long)blink::{name} == {value}ll, \"{name}\");" if value < 0 else
                    f"static_assert((unsigned long long)blink::{name} == {value}ull, \"{name}\");"
                    for name, value in self.constants.items()]
        # The device passes of nvcc check the same facts; the host pass (and g++) prints them for the diff.
        device = "#if defined(__CUDA_ARCH__)\n" + "\n".join(asserts) + "\n#endif\n"
        main = "int main() {\n" + "\n".join(f"  {line}" for line in [*body, *self.extra_code]) + "\n  return 0;\n}\n"
        # By path, not -I: an -I would shadow system headers (csrc/sched.h vs <sched.h>).
        return PRELUDE.format(header=self.include_dir / self.header) + device + main

    def run(self, compiler: str, workdir: Path) -> list[str]:
        """Compile the program with `compiler` ("g++" or "nvcc"), run it, return its lines."""
        source = workdir / ("abi_dump.cu" if compiler == "nvcc" else "abi_dump.cpp")
        source.write_text(self.program())
        binary = workdir / f"abi_dump_{compiler.replace('+', 'x')}"
        flags = ["-x", "cu", "-Xcompiler", "-Wall,-Werror"] if compiler == "nvcc" else ["-Wall", "-Werror"]
        command = [shutil.which(compiler) or compiler, "-std=c++17", *flags, str(source), "-o", str(binary)]
        built = subprocess.run(command, capture_output=True, text=True)
        assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stdout}{built.stderr}"
        return subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.splitlines()

    @staticmethod
    def _pointee(struct, name: str, ctype):
        if ctypes_kind(ctype) != "p":
            return None
        return getattr(struct, "_pointees_", {}).get(name)
