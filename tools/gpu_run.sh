#!/usr/bin/env bash
# Run on the lent GPU machine (device tool): bash tools/gpu_run.sh STAGE...
# Stages: env | tests | step | offline | device | serve-tests. Logs go to $OUT (or /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export BLINK_CACHE=/tmp/blink-cache
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
for stage in "$@"; do
  echo "=== stage $stage $(date +%T)"
  case $stage in
    env) nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv; nproc;
         python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())';;
    tests) python3 -m pytest -q -m gpu --timeout 300 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40;;
    diag) python3 tools/diag.py precision profile 2>&1 | tee "$OUT/diag.log";;
    fp32) python3 tools/diag.py fp32 2>&1 | grep -v Warn | tee "$OUT/fp32.log";;
    sampling) python3 -m blink.kernels.bench_sampling --old-file old_sampling.py 2>&1 | tee "$OUT/sampling.log" | tail -40;;
    step8b) python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 2>&1 | tee "$OUT/step8b.log";;
    step8b-smallm) BLINK_SMALL_M_GEMM=1 python3 -m blink.bench.step step --presets llama3-8b --batches 1,8 2>&1 | tee "$OUT/step8b_smallm.log";;
    precision) python3 tools/diag.py precision 2>&1 | grep -v Warn | tee "$OUT/precision.log";;
    profile) python3 tools/diag.py profile 2>&1 | grep -v Warn | tee "$OUT/profile.log";;
    serve-gpu) python3 -m pytest -q -m gpu tests/frontend 2>&1 | tee "$OUT/serve_gpu.log" | tail -30;;
    tests-k) python3 -m pytest -q -m gpu tests/kernels tests/model 2>&1 | tee "$OUT/gpu_tests_k.log" | tail -30;;
    step) python3 -m blink.bench.step step --result-json "$OUT/step.json" 2>&1 | tee "$OUT/step.log";;
    offline) python3 -m blink.bench.offline offline --result-json "$OUT/offline.json" 2>&1 | tee "$OUT/offline.log";;
    device) python3 -m blink.control.gpu_selftest 2>&1 | tee "$OUT/device.log" | tail -60;;
    *) echo "unknown stage $stage";;
  esac
done
