#!/usr/bin/env bash
# FlashInfer for issue 17's anchor (bench/kernels/flashinfer_anchor.py; `bash tools/gpu_run.sh flashinfer` with
# carry [".fi"]), built here so that the GPU machine compiles nothing and the carry stays under 64 MiB:
#   .fi/flashinfer_python-0.5.3-py3-none-any.whl  the JIT wheel without its CUTLASS and spdlog headers (31 of its
#                                                  41 MB; the three modules below include neither: ninja -t deps)
#   .fi/apache_tvm_ffi-*-cp312-*.whl               its runtime, for the GPU image's Python 3.12
#   .fi/aot.tar.xz                                 the sampling, decode and fa2 prefill modules (bf16, head dim 128)
#                                                  for sm_90, which flashinfer loads from flashinfer/data/aot/;
#                                                  with FI_FA3=1 also Hopper's fa3 prefill (sm_90a; built with the
#                                                  full wheel's CUTLASS headers, which only the build needs)
# The image has the rest (ninja, einops, tabulate, click, nvidia-ml-py, nvidia-curand; KINDS.md's list). Building
# here needs nvcc 13 (/usr/local/cuda-13.0), curand's headers (from the nvidia-curand wheel) and a stub libcuda
# (only to link; the GPU's own is loaded there). Needs .venv (the README's test command) for torch.
set -euo pipefail
cd "$(dirname "$0")/.."
FI_VERSION=0.5.3 TVM_FFI=0.1.15.post2
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.fi/' "$exclude" 2>/dev/null || echo '/.fi/' >> "$exclude"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
pip_get() {  # DEST PYVER SPEC...: binary wheels only, no dependencies
  local dest=$1 py=$2; shift 2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dest" "$@"
}
rm -rf .fi && mkdir -p .fi "$work/slim" "$work/host" "$work/inc" "$work/stubs" "$work/aot"
pip_get "$work" 3.12 "flashinfer-python==$FI_VERSION"
(cd "$work/slim" && unzip -q "$work"/flashinfer_python-*.whl && rm -rf flashinfer/data/cutlass flashinfer/data/spdlog \
  && grep -v '^flashinfer/data/cutlass/\|^flashinfer/data/spdlog/' ./*.dist-info/RECORD > "$work/RECORD" \
  && mv "$work/RECORD" ./*.dist-info/RECORD && zip -q -r -9 "$OLDPWD/.fi/flashinfer_python-$FI_VERSION-py3-none-any.whl" .)
pip_get .fi 3.12 "apache-tvm-ffi==$TVM_FFI"
# the build, with this machine's Python
host_py=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
pip_get "$work/host" "$host_py" "apache-tvm-ffi==$TVM_FFI"
.venv/bin/python -m pip install -q --no-index --no-deps --target "$work/site" "$work"/host/*.whl \
  "$work/flashinfer_python-$FI_VERSION-py3-none-any.whl"  # the full wheel: fa3 includes CUTLASS
pip_get "$work" 3.12 nvidia-curand
(cd "$work/inc" && unzip -q "$work"/nvidia_curand-*.whl 'nvidia/cu13/include/*')
echo "" > "$work/stubs/e.c" && gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stubs/libcuda.so" "$work/stubs/e.c"
FI_FA3=${FI_FA3:-0} FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$work/ws" MAX_JOBS=$(nproc) \
CPATH="$work/inc/nvidia/cu13/include" LIBRARY_PATH="/usr/local/cuda-13.0/lib:$work/stubs" \
PATH="$work/site/bin:$PATH" PYTHONPATH="$work/site" .venv/bin/python - <<'EOF'
import os

import torch
from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module
from flashinfer.jit.page import gen_page_module
from flashinfer.jit.sampling import gen_sampling_module

bf16, head_dim = torch.bfloat16, 128  # llama3-8b's; the anchor's wrappers ask for exactly these
backends = ("fa2", "fa3") if os.environ["FI_FA3"] == "1" else ("fa2",)
for spec in (gen_sampling_module(),
             gen_batch_decode_module(bf16, bf16, bf16, torch.int32, head_dim, head_dim, 0, False, False),
             *(gen_batch_prefill_module(b, bf16, bf16, bf16, torch.int32, head_dim, head_dim, 0, False, False, False)
               for b in backends),
             *((gen_page_module(),) if "fa3" in backends else ())):  # fa3 turns 16-token pages into token offsets
    spec.build(verbose=False)
    print("built", spec.name)
EOF
find "$work/ws" -name '*.so' -path '*cached_ops*' -exec cp {} "$work/aot/" \;
(cd "$work/aot" && tar cf - ./*.so | xz -9 -T0 > "$OLDPWD/.fi/aot.tar.xz")
ls -la .fi
