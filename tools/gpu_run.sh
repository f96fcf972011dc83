#!/usr/bin/env bash
# Run on the lent GPU machine (device tool): bash tools/gpu_run.sh STAGE...
# Needs .whl/ (bash tools/fetch_wheels.sh here, then carry [".whl"]) for the server stages.
# Stages: env | tests | step | step-sampling | sampling | sampling-profile | offline | device | barrier (2 GPUs) | replicas (2 GPUs) | ... (tools/gpu_stages/: one file a topic). Logs go to $OUT (or /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export BLINK_CACHE=/tmp/blink-cache TRITON_CACHE_DIR=/tmp/triton-cache  # fixed paths: the Triton cache names its files by absolute path
# Caches carried in from an earlier machine (stage cache-out): a fresh machine's first server start then skips
# the Triton compiles and the scheduler's nvcc build. Restored once per machine. Without a carried .gpu_cache the
# newest copy kept in git (docs/results/*/gpu_cache/) is used: a new checkout has no .gpu_cache, and a bare
# machine spent 150 s of a timeline and 290 s of tests/model compiling with nothing printed (session 20).
cache_dir=.gpu_cache
[ -d "$cache_dir" ] || cache_dir=$(ls -d docs/results/*/gpu_cache 2> /dev/null | sort | tail -1)
untar_tmp() {  # FILE: unpack an xz'd tar into /tmp with Python's tarfile, so the image needs no xz binary
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("/tmp", filter="tar")' "$1"
}
# One xz'd tar (cubins compress 15x under xz's large window, 4x under gzip: session 35).
if [ -d "$cache_dir" ] && [ ! -e /tmp/.gpu_cache_restored ]; then
  untar_tmp "$cache_dir/gpu_cache.tar.xz" && touch /tmp/.gpu_cache_restored \
    && echo "restored caches from $cache_dir: triton $(du -sh /tmp/triton-cache | cut -f1), $(ls /tmp/triton-cache | wc -l) kernels"
fi
if [ -e .whl_site/site.tar.xz ] || [ -d .whl ]; then
  # .whl_site/site.tar.xz (tools/pack_site.sh: the installed tree, xz'd, 1.8 MB smaller) or .whl/'s wheels.
  # vllm-router (24 MB, the replicas stage only) lives in .whl_router/ so that the other calls' carry stays small;
  # installed once per machine (each later gpu_run.sh of a call chain reuses /tmp/site)
  if [ ! -e /tmp/site/.blink_installed ]; then
    if [ -e .whl_site/site.tar.xz ]; then
      untar_tmp .whl_site/site.tar.xz || exit 1
    fi
    wheels=$(ls .whl/*.whl .whl_router/*.whl 2> /dev/null)
    if [ -n "$wheels" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $wheels || exit 1
    fi
    touch /tmp/site/.blink_installed
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
wait_healthy() {  # PORT [SECONDS [PID]]: until the server answers /health; fails at once if PID has exited
  for _ in $(seq 1 "${2:-300}"); do
    curl -sf "localhost:$1/health" > /dev/null && return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2> /dev/null; then return 1; fi
    sleep 1
  done; return 1
}
die_server() {  # PID LOG WHAT: say loudly that the server is dead or not healthy, show its log, stop the stage
  echo "FATAL: $3: server pid $1 $(kill -0 "$1" 2> /dev/null && echo 'alive but not healthy' || echo 'has exited')"
  echo "--- last lines of $2"; tail -40 "$2"
  kill -9 "$1" 2> /dev/null; wait "$1" 2> /dev/null; exit 1
}
stop_server() {  # PID: SIGINT, then SIGKILL after 25 s (blink serve stops within 20 s; transformers serve may not)
  kill -INT "$1"; for _ in $(seq 1 25); do kill -0 "$1" 2> /dev/null || break; sleep 1; done
  kill -9 "$1" 2> /dev/null; wait "$1"
}
frontend_load() {  # PORT NAME: 50 one-token prompts at concurrency 1, then the server's own sums: TTFT (from the
  # request's arrival), ITL, and queue + prefill (submission to first token: the engine path alone)
  python3 -m blink bench serve --base-url "http://127.0.0.1:$1" --num-prompts 50 --max-concurrency 1 \
    --random-input-len 1 --random-output-len 64 --ignore-eos --disable-tqdm --result-json "$OUT/$2.json"
  curl -s "localhost:$1/metrics" | grep -E "^blink:(time_to_first_token|inter_token_latency|request_queue_time|request_prefill_time)_seconds_(sum|count)" \
    | tee "$OUT/${2}_metrics.txt"
}
for group in kernels device serve lab; do source "$(dirname "$0")/gpu_stages/$group.sh"; done
rc=0  # the last failing stage's status (an unknown stage: 2); before session 34 the loop's test made every run 1
for stage in "$@"; do
  echo "=== stage $stage $(date +%T)"
  handled=99
  for group in kernels device serve lab; do  # tools/gpu_stages/<group>.sh, one topic each
    "stages_$group" "$stage"; handled=$?
    [ "$handled" -ne 99 ] && break
  done
  if [ "$handled" -eq 99 ]; then echo "unknown stage $stage"; rc=2; elif [ "$handled" -ne 0 ]; then rc=$handled; fi
done
exit $rc
