#!/usr/bin/env bash
# The GPU scheduler's C++ (blink/device/csrc), built for the host with a sanitizer, under the CPU tests that run
# it with host threads as the CTA (tests/device, no GPU, no nvcc).
#   bash tools/sanitize_scheduler.sh asan   # AddressSanitizer + UndefinedBehaviorSanitizer
#   bash tools/sanitize_scheduler.sh tsan   # ThreadSanitizer (suppressions: tools/tsan.supp)
# Exit 0: the tests passed and the sanitizer reported nothing. Its reports land in $OUT (default a temp dir).
set -u
kind=${1:?asan or tsan}; PY=${PY:-.venv/bin/python}
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"; rm -f "$OUT"/report.*
case $kind in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
        preload=$(gcc -print-file-name=libasan.so)
        export ASAN_OPTIONS="detect_leaks=0 log_path=$OUT/report" UBSAN_OPTIONS="print_stacktrace=1 log_path=$OUT/report";;
  tsan) flags="-fsanitize=thread -fno-omit-frame-pointer -g"
        preload=$(gcc -print-file-name=libtsan.so)
        export TSAN_OPTIONS="halt_on_error=1 report_signal_unsafe=0 log_path=$OUT/report suppressions=$PWD/tools/tsan.supp";;
  *) echo "sanitize_scheduler: asan or tsan, not $kind" >&2; exit 2;;
esac
[ -f "$preload" ] || { echo "sanitize_scheduler: no $preload (gcc's sanitizer runtime)" >&2; exit 3; }
# Left out: what builds with nvcc (it crashes under the preloaded runtime), the grammar compile pool (its memory
# limit refuses the sanitizer's shadow mappings), the GPU tests, and this check's own test.
BLINK_HOST_CXXFLAGS="$flags" LD_PRELOAD=$preload TRITON_INTERPRET=1 $PY -m pytest -q -p no:randomly -m "not gpu" \
  tests/device --ignore tests/device/test_build.py --ignore tests/device/test_device_constraints.py \
  --ignore tests/device/test_sanitizers.py --deselect tests/device/test_structs.py::test_header_matches_ctypes_under_nvcc
rc=$?
if ls "$OUT"/report.* > /dev/null 2>&1; then
  echo "sanitize_scheduler: $kind reported:"; cat "$OUT"/report.*; exit 1
fi
exit $rc
