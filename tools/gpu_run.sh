#!/usr/bin/env bash
# Run on the lent GPU machine (device tool): bash tools/gpu_run.sh STAGE...
# Needs .whl/ (bash tools/fetch_wheels.sh here, then carry [".whl"]) for the server stages.
# Stages: env | tests | step | step-sampling | sampling | sampling-profile | offline | device | barrier (2 GPUs) | replicas (2 GPUs) | ... (see the case below). Logs go to $OUT (or /tmp/out).
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
if [ -d "$cache_dir" ] && [ ! -e /tmp/.gpu_cache_restored ]; then
  cat "$cache_dir"/gpu_cache_* | tar xz -C /tmp && touch /tmp/.gpu_cache_restored \
    && echo "restored caches from $cache_dir: triton $(du -sh /tmp/triton-cache | cut -f1), $(ls /tmp/triton-cache | wc -l) kernels"
fi
if [ -d .whl ]; then
  # vllm-router (24 MB, the replicas stage only) lives in .whl_router/ so that the other calls' carry stays small;
  # installed once per machine (each later gpu_run.sh of a call chain reuses /tmp/site)
  if [ ! -e /tmp/site/.blink_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl $(ls .whl_router/*.whl 2> /dev/null) && touch /tmp/site/.blink_installed || exit 1
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
for stage in "$@"; do
  echo "=== stage $stage $(date +%T)"
  case $stage in
    env) nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv; nproc;
         python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())';;
    tests) python3 -m pytest -q -s -m gpu --timeout 300 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40;;
    grammar-device)  # issue 15 in device mode: seeded constrained sampling host == device, the API suite on a device server
      python3 -m pytest -q -s -m gpu --timeout 900 tests/device/test_grammar_device_gpu.py \
        tests/grammar/test_api_structured_device_gpu.py 2>&1 | tee "$OUT/grammar_device.log" | tail -30;;
    grammar-serve)  # issue 15: constrained serving (a typical schema on every request), device vs host at 8 req/s:
      # the engine's host CPU per 1k tokens (target ~0 in device mode), TTFT and TPOT; point cache reset as always
      # the preset's word-level vocabulary cannot spell JSON: the demo model's byte-level BPE vocabulary serves
      # as a real one over llama3-8b's shapes (blink serve --tokenizer; the logits keep 128,256 columns)
      python3 -c 'import json; from bench.grammar.compile_libraries import SCHEMAS; json.dump(SCHEMAS["person"], open("/tmp/person.json", "w"))'
      # GRAMMAR_VOCAB=DIR: a tokenizer.json there instead, e.g. the 87k-token byte-level BPE that
      # bench/grammar/compile_libraries.train_vocab trains on Python sources (minutes on 2 cores: train it
      # here, save it as .gpu_vocab/tokenizer.json, carry ".gpu_vocab"): automata near a real model's size
      if [ -n "${GRAMMAR_VOCAB:-}" ]; then
        vocab=$GRAMMAR_VOCAB
      else
        vocab=$(python3 -c 'from blink.model.demo import ensure_default_model; print(ensure_default_model())')
      fi
      python3 -m blink bench interference --model llama3-8b --tokenizer "$vocab" --modes "${GRAMMAR_MODES:-device,host}" --frontend-cpus 0-1 --engine-cpus 2-7 \
        --max-model-len 2048 --request-rates 8 --attack-levels 0 --attack-kinds spin --point-seconds 20 \
        --random-input-len 256 --random-output-len 128 --json-schema /tmp/person.json --disable-tqdm \
        --result-dir /tmp/grammar-serve > "$OUT/grammar_serve.log" 2>&1; tail -5 "$OUT/grammar_serve.log"
      cp /tmp/grammar-serve/results.md "$OUT/grammar_serve_results.md"; tar czf "$OUT/grammar_serve.tgz" -C /tmp grammar-serve;;
    grammar-step)  # issue 15: a constrained decode step (typical schema) vs unconstrained, llama3-8b, batch 1/8/32
      python3 -m bench.grammar.constrained_step --preset llama3-8b --batches 1,8,32 --context 1024 \
        --result-json "$OUT/grammar_step.json" 2>&1 | tee "$OUT/grammar_step.log" | tail -20;;
    kernels)  # KERNELS_ARGS: e.g. "--sections attention --batches 1,8 --context 1024,4096,8192,32768" (one block-table
      # width for all: the longest context; llama3-8b's step section at 32k fits batch 8, not 32); KERNELS_TAG names the log;
      # KERNELS_VARIANTS: attention variants by name, ';'-separated (names hold spaces: "~" for them in a chain)
      python3 bench/kernels/step_kernels.py ${KERNELS_ARGS:-} ${KERNELS_VARIANTS:+--variants "$KERNELS_VARIANTS"} 2>&1 \
        | tee "$OUT/kernels${KERNELS_TAG:-}.log" | tail -60;;
    prefill-attn)  # issue 17: the attention kernel alone on 2k-32k-token chunks, tile variants (PREFILL_ATTN_ARGS: e.g. "--tokens 8192")
      python3 -m bench.kernels.prefill_attention ${PREFILL_ATTN_ARGS:-} 2>&1 | tee "$OUT/prefill_attn_$(date +%H%M%S).log";;  # stamped: a chain may run it twice
    fusion)  # issue 17's per-layer levers: GEMV vs today's kernels per projection, the step with each lever on/off
      python3 -m bench.kernels.fusion 2>&1 | tee "$OUT/fusion.log" | tail -70;;
    graph-eager)  # issue 17: graphs vs eager (padded to the buckets, exact) under attention tunings and PDL off
      python3 -m tools.diag_graph_eager 2>&1 | grep -v Warn | tee "$OUT/graph_eager.log";;
    fusion-tests) python3 -m pytest -q -s -m gpu tests/model/test_fusion_gpu.py tests/kernels/test_kernels_gpu.py \
        2>&1 | tee "$OUT/fusion_tests.log" | tail -30;;
    fusion-step)  # the official step bench (sampling included) with the levers off, then on (FUSION_ENV; default:
      # the defaults, the GEMV at one row and PDL since 2026-12-02)
      BLINK_GEMV= BLINK_PDL=0 python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 2>&1 \
        | tee "$OUT/fusion_step_off.log"
      env ${FUSION_ENV:-BLINK_PDL=1} python3 -m blink.bench.step step --presets llama3-8b \
        --batches 1,8,32 2>&1 | tee "$OUT/fusion_step_on.log";;
    flashinfer)  # issue 17's anchor: FlashInfer 0.5.3's decode attention and sampling beside ours
      # (bench/kernels/flashinfer_anchor.py). Needs .fi (bash tools/fetch_flashinfer.sh here; carry [".fi"], not .whl:
      # the tree and both pass 64 MiB). Its modules come prebuilt for sm_90 (flashinfer/data/aot/); FI_ARGS adds flags.
      [ -d .fi ] || { echo "FATAL: no .fi: bash tools/fetch_flashinfer.sh, then carry .fi"; exit 1; }
      if [ ! -e /tmp/fi-site/.installed ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fi-site .fi/*.whl \
          || exit 1
        mkdir -p /tmp/fi-aot && tar xJf .fi/aot.tar.xz -C /tmp/fi-aot || exit 1
        for so in /tmp/fi-aot/*.so; do  # flashinfer loads data/aot/<name>/<name>.so before it would compile
          dest=/tmp/fi-site/flashinfer/data/aot/$(basename "$so" .so); mkdir -p "$dest" && mv "$so" "$dest/"
        done
        touch /tmp/fi-site/.installed
      fi
      PYTHONPATH=/tmp/fi-site:$PYTHONPATH FLASHINFER_CUDA_ARCH_LIST=9.0 python3 -m bench.kernels.flashinfer_anchor \
        ${FI_ARGS:-} 2>&1 | tee "$OUT/flashinfer_anchor_$(date +%H%M%S).log" | tail -60;;
    sampling)  # issue 17: the selection rows at S = 1/8/32/128, 128 buckets per level (sampling_bucket.NUM_BUCKETS),
      # at the engine's programs per kernel (sampling_grid.programs_for), PDL as the engine takes it (one row only;
      # --pdl off,on: both), the old and new ways of session 17's levers: the race over the row or over the kept
      # tokens' list (BLINK_SAMPLER_RACE), the compaction's two reads or one (BLINK_SAMPLER_COMPACT); mismatches vs
      # the CPU reference / rows that fell back. SAMPLER_ARGS replaces it all (the old sampler: drop --no-old; every
      # scenario: drop --scenarios). Session 11: 2 columns x 4 sizes took ~150 s (4 columns now).
      python3 -m bench.kernels.sampler ${SAMPLER_ARGS:---buckets 128 --programs engine --pdl engine --race row,list --compact twice,once --no-old --sizes 1 8 32 128 \
        --scenarios top_p,top_k,top_k+top_p,min_p,top_p_flat,top_k_flat,logprobs20,greedy} 2>&1 \
        | tee "$OUT/sampling.log" | tail -40
      python3 -m pytest -q -m gpu tests/kernels/test_sampling_select.py tests/kernels/test_sampling.py 2>&1 \
        | tee "$OUT/sampling_tests.log" | tail -10;;
    sampling-profile)  # issue 17: the sampler's per-kernel times at S = 1 and 32 (top_p, top_k), the old ways of
      # session 17's levers, then the new (BLINK_SAMPLER_RACE=list, BLINK_SAMPLER_COMPACT=once)
      BLINK_SAMPLER_RACE=row BLINK_SAMPLER_COMPACT=twice python3 tools/diag_chunk.py sampler 2>&1 \
        | tee "$OUT/sampling_profile_old.log" | tail -40
      BLINK_SAMPLER_RACE=list BLINK_SAMPLER_COMPACT=once python3 tools/diag_chunk.py sampler 2>&1 \
        | tee "$OUT/sampling_profile_new.log" | tail -40;;
    step-sampling)  # issue 17: llama3-8b decode rows greedy vs top_p / top_k, and prefill rows with their floors
      python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 --sampling "${STEP_SAMPLING:-greedy,top_p,top_k}" \
        --prefill-tokens "${STEP_PREFILL:-2048,8192,32768,100@2000}" --result-json "$OUT/step_sampling.json" 2>&1 | tee "$OUT/step_sampling.log";;
    diag) python3 tools/diag.py precision profile 2>&1 | tee "$OUT/diag.log";;
    fp32) python3 tools/diag.py fp32 2>&1 | grep -v Warn | tee "$OUT/fp32.log";;
    step8b) python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 2>&1 | tee "$OUT/step8b.log";;
    precision) python3 tools/diag.py precision 2>&1 | grep -v Warn | tee "$OUT/precision.log";;
    profile) python3 tools/diag.py profile 2>&1 | grep -v Warn | tee "$OUT/profile.log";;
    timeline)  # issue 17: one replayed decode graph kernel by kernel (llama3-8b, TIMELINE_BATCHES, default 1): time by
      # name and a mid-step window; with PDL kernels overlap, so read a kernel's cost as completion to completion
      python3 tools/diag.py timeline 2>&1 | grep -v Warn | tee "$OUT/timeline_$(date +%H%M%S).log";;
    ncu-attn)  # issue 17: Nsight Compute on one decode attention launch (NCU_BATCH, NCU_VARIANT of step_kernels'
      # attention variants): occupancy, waves, DRAM throughput, warp stalls. Firecracker machines only (KINDS.md)
      ncu --clock-control none -k regex:_paged_attention_kernel -c 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        python3 bench/kernels/step_kernels.py --sections attention --batches "${NCU_BATCH:-64}" \
        --variants "${NCU_VARIANT:-default}" 2>&1 | tee "$OUT/ncu_attn_b${NCU_BATCH:-64}.log" | tail -120;;
    gemv-proj)  # issue 17: each projection alone at M = GEMV_MS rows: cuBLAS (+ the norm / SiLU kernel) vs the GEMV, GB/s
      python3 -m bench.kernels.fusion --sections gemv --ms "${GEMV_MS:-1}" --projections "${GEMV_PROJ:-all}" \
        --sweep "${GEMV_SWEEP:-all}" 2>&1 \
        | tee "$OUT/gemv_proj_$(date +%H%M%S).log" | tail -30;;
    fusion-levers)  # issue 17: the whole step with each lever, session 11's kernels vs today's side by side
      # (FUSION_CONTEXT may be a list, e.g. 1024,8192,32768; at 32k llama3-8b's KV fits batch 8, not 32)
      python3 -m bench.kernels.fusion --sections step --batches "${FUSION_BATCHES:-1,8,32}" --levers "${LEVERS:-all}" \
        --context "${FUSION_CONTEXT:-1024}" 2>&1 \
        | tee "$OUT/fusion_levers_$(date +%H%M%S).log" | tail -30;;
    serve-gpu) python3 -m pytest -q -m gpu tests/frontend 2>&1 | tee "$OUT/serve_gpu.log" | tail -30;;
    pytest)  # chosen GPU tests: PYTEST_ARGS, e.g. "tests/kernels/test_kernels_gpu.py -k attention" (~ for spaces in a chain)
      python3 -m pytest -q -m gpu --timeout 300 ${PYTEST_ARGS:?PYTEST_ARGS names the tests} 2>&1 \
        | tee "$OUT/pytest_$(date +%H%M%S).log" | tail -30;;
    tests-k) python3 -m pytest -q -m gpu tests/kernels tests/model 2>&1 | tee "$OUT/gpu_tests_k.log" | tail -30;;
    step) python3 -m blink.bench.step step --result-json "$OUT/step.json" 2>&1 | tee "$OUT/step.log";;
    offline) python3 -m blink.bench.offline offline --result-json "$OUT/offline.json" 2>&1 | tee "$OUT/offline.log";;
    device) python3 -m tools.device_selftest.gpu_selftest 2>&1 | tee "$OUT/device.log" | tail -60;;
    device-arrival)  # issues 16/17: TTFT in steps of requests arriving mid-forward (the step once lost at ingest)
      python3 -m tools.device_selftest.gpu_selftest --arrival --skip-checks 2>&1 | tee "$OUT/device_arrival.log" | tail -8;;
    device-prefix)  # issue 16: control gap and plan phase behind a 2,000-token shared prefix, cache off vs on
      python3 -m tools.device_selftest.gpu_selftest --prefix --skip-checks 2>&1 | tee "$OUT/device_prefix.log" | tail -30;;
    device-prefix-arrival)  # issue 16: cached-prefix probes on llama3-8b: submit-to-token ms, launches in between
      python3 -m tools.device_selftest.gpu_selftest --prefix-arrival --skip-checks 2>&1 | tee "$OUT/device_prefix_arrival.log" | tail -8;;
    device-probes)  # device-arrival and device-prefix in one process (one CUDA start, no tiny timings)
      python3 -m tools.device_selftest.gpu_selftest --arrival --prefix --skip-checks 2>&1 | tee "$OUT/device_probes.log" | tail -30;;
    idle-power)  # issue 19: idle W / NVML utilisation / engine CPU, TTFT after 1 s idle: host | device spin, deep, park
      python3 -m blink.bench.idle_power --model "${IDLE_MODEL:-llama3.2-1b}" --log-dir /tmp/idle_power \
        --result-json "$OUT/idle_power.json" 2>&1 | grep --line-buffered -v "it/s" | tee "$OUT/idle_power.log" | tail -12
      tar czf "$OUT/idle_power_logs.tgz" -C /tmp idle_power;;
    device8b) python3 -m tools.device_selftest.gpu_selftest --offline-8b --skip-checks 2>&1 | tee "$OUT/device8b.log" | tail -40;;
    device-gap)  # issue 17: the tiny timings, then llama3-8b's decode gap (GAP_LAYERS layers, default 32): resident
      # (steps launched ahead) | sync | relaunch, each with its gap phases
      python3 -m tools.device_selftest.gpu_selftest --llama3-8b --skip-checks --layers "${GAP_LAYERS:-32}" 2>&1 \
        | tee "$OUT/device_gap.log" | tail -40;;
    device8b-load) python3 -m tools.device_selftest.gpu_selftest --llama3-8b --interference --skip-checks 2>&1 | tee "$OUT/device8b_load.log" | tail -60;;
    frontend-overhead)  # TTFT of a 1-token prompt and ITL at low load through the front end, vs the engine step
      python3 -m blink serve --model llama3.2-1b --engine device --max-model-len 2048 --port 8011 > "$OUT/serve.log" 2>&1 & srv=$!
      wait_healthy 8011 120
      frontend_load 8011 frontend  # the server's own TTFT (submit to first token) splits the client's in two
      stop_server $srv
      python3 -m blink.bench.step step --presets llama3.2-1b --batches 1 2>&1 | tee -a "$OUT/frontend_step.log";;
    frontend-null)  # the same load against a zero-cost engine (blink/bench/null_engine.py): the front end alone
      python3 -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port 8014 \
        > "$OUT/serve_null.log" 2>&1 & srv=$!
      wait_healthy 8014 120
      frontend_load 8014 frontend_null
      stop_server $srv;;
    interference) python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 \
        --engine-cpus 2-7 --request-rates 2,8,16,32 --attack-levels 0,2 --attack-kinds spin --point-seconds 30 \
        --ignore-eos --random-input-len 512 --random-output-len 128 --result-dir /tmp/interference;
      tar czf "$OUT/interference.tgz" -C /tmp interference;;  # $OUT returns at most 8 files
    tp) timeout ${TP_TIMEOUT:-300} python3 -m pytest -x -q -s -m gpu --timeout 100 tests/parallel 2>&1 \
          | grep --line-buffered -v "it/s" \
          | tee "$OUT/tp_tests.log" | tail -30;;
    barrier)  # TP=2 (needs nvidia-h200-x2), both modes: ranks pinned to cores 2 and 3; isolated, rank 1's core, all
      # (BARRIER_ARGS: more flags, e.g. --all-reduce p2p; TAG: a suffix for the output files)
      for engine in ${BARRIER_ENGINES:-host device}; do
        timeout ${BARRIER_TIMEOUT:-200} python3 -m blink bench barrier --model llama3-8b --num-layers 8 --device cuda --engine $engine \
          -tp 2 --rank-cpus "2;3" --attack-rank 1 --attack-kind spin --num-prompts 32 --input-len 128 \
          --output-len 96 --max-model-len 512 ${BARRIER_ARGS:-} --result-json "$OUT/barrier_$engine${TAG:-}.json" 2>&1 \
          | grep --line-buffered -v "it/s" | tee "$OUT/barrier_$engine${TAG:-}.log" | tail -12
      done;;
    tp-interference)  # 2 GPUs: serving at TP=2 under attack, ranks on cores 2 and 3; TPI_WHERE: rank1 (core 3) and/or all
      for where in ${TPI_WHERE:-rank1 all}; do
        if [ "$where" = rank1 ]; then cpus=3; levels=0,2; else cpus=2-3; levels=2; fi
        python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 --engine-cpus 2-3 \
          --attack-cpus $cpus --serve-args "-tp 2 --rank-cpus '2;3'" --max-model-len 1024 --request-rates 8,32 \
          --attack-levels $levels --attack-kinds spin --point-seconds 15 --ignore-eos --random-input-len 512 \
          --random-output-len 128 --result-dir /tmp/tpi-$where 2>&1 | grep --line-buffered -v "it/s"
        tar czf "$OUT/tp_interference_$where.tgz" -C /tmp tpi-$where
      done;;
    tp-serve)  # 2 GPUs: serving throughput at TP=2 behind blink serve, both modes, all requests at once
      for engine in ${TP_SERVE_ENGINES:-device host}; do
        python3 -m blink serve --model llama3-8b --engine $engine -tp 2 --max-model-len 1024 --port 8012 \
          ${TP_SERVE_ARGS:-} > "/tmp/tp_serve_$engine.log" 2>&1 & srv=$!
        wait_healthy 8012
        timeout 240 python3 -m blink bench serve --base-url http://127.0.0.1:8012 --num-prompts 200 --request-rate inf \
          --random-input-len 512 --random-output-len 128 --ignore-eos --disable-tqdm \
          --result-json "$OUT/tp_serve_$engine${TAG:-}.json" | grep -E "Successful|Failed|Output token|TTFT|TPOT"
        stop_server $srv
      done;;
    hf-peer)  # issue 6's peer: `transformers serve` (continuous batching) and blink serve, same weights and load
      preset=${PEER_PRESET:-llama3-8b}; dir=/tmp/hf-$preset
      # transformers serve imports openai's Responses types at start; an old openai kills it at import
      python3 -c 'import openai, transformers; from transformers.cli.serving import response, completion, server
print("transformers", transformers.__version__, "openai", openai.__version__, "serving imports")' \
        || { echo "FATAL: transformers serve cannot import (openai too old? bash tools/fetch_wheels.sh, carry .whl)"; exit 1; }
      python3 tools/hf_peer.py "$preset" "$dir" --device "${PEER_DEVICE:-cuda}" 2>&1 | tail -1
      for target in hf "${PEER_ENGINE:-device}"; do
        log="$OUT/peer_$target.log"
        if [ "$target" = hf ]; then
          python3 -c 'import sys; from transformers.cli.transformers import main; sys.argv[0] = "transformers"; main()' \
            serve "$dir" --continuous-batching --device "${PEER_DEVICE:-cuda}" --port 8013 > "$log" 2>&1 &
        else
          python3 -m blink serve --model "$dir" --engine "$target" --max-model-len "${PEER_MAX_LEN:-2048}" --port 8013 \
            > "$log" 2>&1 &
        fi
        srv=$!
        wait_healthy 8013 "${PEER_START_TIMEOUT:-600}" $srv || die_server $srv "$log" "$target did not come up"
        timeout 150 python3 -m blink bench serve --base-url http://127.0.0.1:8013 --model "$dir" --num-prompts 8 \
          --random-input-len 64 --random-output-len 16 --disable-tqdm > /dev/null \
          || die_server $srv "$log" "$target failed the warm-up"  # not recorded, but it must succeed
        for rate in ${PEER_RATES:-2 8}; do  # no --ignore-eos: transformers serve refuses the field
          echo "--- $target, $rate req/s"
          kill -0 $srv 2> /dev/null || die_server $srv "$log" "$target died before $rate req/s"
          # bench serve exits non-zero when no request succeeded; pipefail carries that through grep
          timeout 150 python3 -m blink bench serve --base-url http://127.0.0.1:8013 --model "$dir" \
            --num-prompts $((rate * ${PEER_SECONDS:-20})) --request-rate "$rate" --random-input-len "${PEER_INPUT:-512}" \
            --random-output-len 128 --disable-tqdm --result-json "$OUT/peer_${target}_rate$rate.json" \
            | grep -E "Successful|Failed|Output token|P99 TTFT|P99 TPOT" || die_server $srv "$log" "$target at $rate req/s"
          python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(r["failed"] > 0)' \
            "$OUT/peer_${target}_rate$rate.json" || die_server $srv "$log" "$target: failed requests at $rate req/s"
        done
        stop_server $srv
      done;;
    prefix)  # issue 16: llama3-8b, 2,000-token shared prefix + 100-token suffixes, 128 out, and multi-turn chat;
      # both modes, the prefix cache on and off (PREFIX_ENGINES, PREFIX_CACHES, PREFIX_RATE: requests/s of the shared-prefix run,
      # PREFIX_PROMPTS: requests per run, PREFIX_MULTITURN=0: the shared-prefix run only)
      for engine in ${PREFIX_ENGINES:-device host}; do
        for cache in ${PREFIX_CACHES:-enable no-enable}; do
          python3 -m blink serve --model llama3-8b --engine $engine --max-model-len 4096 --port 8015 \
            --$cache-prefix-caching > "$OUT/prefix_serve_${engine}_$cache.log" 2>&1 & srv=$!
          wait_healthy 8015
          timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --num-prompts "${PREFIX_PROMPTS:-200}" \
            --request-rate "${PREFIX_RATE:-4}" --random-prefix-len 2000 --random-input-len 100 --random-output-len 128 \
            --ignore-eos --disable-tqdm --result-json "$OUT/prefix_${engine}_$cache.json" \
            | grep -E "Successful|Failed|hit rate|Output token|TTFT"
          # where the shared-prefix run's TTFT goes, from the server's side (sums and counts, seconds)
          curl -s localhost:8015/metrics | grep -E "^blink:(time_to_first_token|request_queue_time|request_prefill_time)_seconds_(sum|count)" \
            | tee "$OUT/prefix_${engine}_${cache}_metrics.txt"
          [ "${PREFIX_MULTITURN:-1}" = 0 ] || timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --dataset-name multi-turn \
            --multi-turn-turns 5 --random-prefix-len 500 --random-input-len 200 --random-output-len 128 \
            --num-prompts "${PREFIX_PROMPTS:-200}" --max-concurrency 40 --ignore-eos --disable-tqdm --seed 1 \
            --result-json "$OUT/multiturn_${engine}_$cache.json" | grep -E "Successful|Failed|hit rate|Output token|TTFT"
          stop_server $srv
        done
      done;;
    gc-ab)  # issue 17/19: the front end's GC freeze on the GPU machine: isolated, 24 req/s, the priority-1 workload and
      # cores, the default (--gc-freeze) against --no-gc-freeze, GCAB_REPEATS interleaved repeats (about 55 s a point
      # with its server start; a machine's first start compiled for 4 minutes in session 10); results.md's pauses
      # section holds each repeat's whole-server pauses and full GCs
      dir=/tmp/gc-ab; mkdir -p "$dir"
      for rep in $(seq 0 $(( ${GCAB_REPEATS:-3} - 1 ))); do for v in default no-gc-freeze; do
        extra=(); [ "$v" = no-gc-freeze ] && extra=(--serve-args=--no-gc-freeze)
        python3 -m blink bench interference --model llama3-8b --modes "${GCAB_MODES:-device}" \
          --layouts "${GCAB_LAYOUTS:-split}" --request-rates 24 --attack-kinds spin --attack-levels 0 --repeats 1 \
          --first-repeat "$rep" --resume --frontend-cpus 0-1 --engine-cpus 2-13 --client-cpus 14-15 \
          --point-seconds 15 --drain-seconds 8 --server-start-s 30 --dataset-name random --random-input-len 512 \
          --random-output-len 128 --random-range-ratio 0.0 --ignore-eos --disable-tqdm --result-dir "$dir" \
          "${extra[@]}" 2>&1 | grep --line-buffered -aE "FATAL|Error|plan:" | tee -a "$OUT/gc_ab.log"
        tar czf "$OUT/gc_ab.tgz" -C /tmp gc-ab  # after every point: session 10's timeout cut the stage before its end
      done; done
      grep -A40 "Whole-server pauses" "$dir/results.md" | tee "$OUT/gc_ab_pauses.md";;
    prefix-interference)  # the shared-prefix workload, device vs host, under the interference lab's CPU attack
      python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 --engine-cpus 2-7 \
        --max-model-len 4096 --request-rates "${PREFIX_RATES:-2,8}" --attack-levels 0,2 --attack-kinds spin \
        --point-seconds "${PREFIX_POINT_S:-30}" --ignore-eos --random-prefix-len 2000 --random-input-len 100 --random-output-len 128 \
        --result-dir /tmp/prefix-interference
      tar czf "$OUT/prefix_interference.tgz" -C /tmp prefix-interference;;
    defaults-serve)  # after a change of defaults (the levers, the sampler): llama3-8b served at 24 req/s isolated, split
      # layout, both modes, 2 interleaved repeats, the priority-1 workload and cores; its points record the client's
      # own stalls beside any whole-server pause (results.md's pauses table)
      python3 -m blink bench interference --model llama3-8b --modes device,host --layouts split --request-rates 24 \
        --attack-levels 0 --repeats 2 --random-input-len 512 --random-output-len 128 --random-range-ratio 0.0 \
        --ignore-eos --frontend-cpus 0-1 --engine-cpus 2-13 --client-cpus 14-15 --point-seconds 15 --drain-seconds 8 \
        --server-start-s "${INTF_START_S:-90}" --disable-tqdm --result-dir /tmp/defaults-serve 2>&1 \
        | grep --line-buffered -v "it/s" | tee "$OUT/defaults_serve.log"
      tar czf "$OUT/defaults_serve.tgz" -C /tmp/defaults-serve points runs results.md;;
    interference-p1|interference-p2)  # issue 19's matrices (blink/bench/sweep_plan.py), in chunks that fit one
      # 10-minute command: each call measures what fits in INTF_BUDGET s and returns only its own new files; the
      # same stage again continues (--resume) on the same machine, or on a fresh one with the earlier folder
      # carried in as .intf/<p1|p2>/ (merge the returned tgz files there first: blink bench interference --merge-from),
      # or, with nothing carried, from the returned chunks kept in git as docs/results/*/*intf_<p1|p2>_points_*.tgz.
      # A fresh machine's first server start takes most of 200 s: INTF_BUDGET below ~300 there measures nothing.
      m=${stage#interference-}; dir=/tmp/intf-$m; mkdir -p "$dir"
      [ -d ".intf/$m" ] && cp -rn ".intf/$m/." "$dir/"
      [ -f ".intf/$m.tgz" ] && tar xzf ".intf/$m.tgz" -C "$dir" --skip-old-files  # points + runs only: a smaller carry
      if [ ! -e ".intf/$m" ] && [ ! -f ".intf/$m.tgz" ]; then  # nothing carried: every chunk kept in git (no carry
        for f in docs/results/*/*intf_"${m}"_points_*.tgz; do  # needed; with .whl it outgrew the 64 MiB limit)
          [ -f "$f" ] && tar xzf "$f" -C "$dir" --skip-old-files
        done
        echo "restored $(find "$dir/points" -name '*.json' 2> /dev/null | wc -l) points from docs/results"
      fi
      touch /tmp/intf-stamp; sleep 1
      python3 -m blink bench interference --model llama3-8b --matrix "priority${m#p}" --frontend-cpus 0-1 \
        --engine-cpus 2-13 --client-cpus 14-15 --point-seconds "${INTF_POINT_SECONDS:-15}" \
        --drain-seconds "${INTF_DRAIN_SECONDS:-8}" --server-start-s "${INTF_START_S:-90}" \
        --time-budget-s "${INTF_BUDGET:-500}" --resume --disable-tqdm --result-dir "$dir" ${INTF_ARGS:-} 2>&1 \
        | grep --line-buffered -v "it/s" | tee "$OUT/intf_${m}.log"
      # the new points and runs as a chunk to keep in git as it comes (named for the restore's glob above), the
      # servers' logs apart (not restored), and the report, which the merged folder redraws here
      (cd "$dir" && find points runs -newer /tmp/intf-stamp -type f 2> /dev/null > /tmp/intf-new
       stamp=$(date +%H%M%S)
       tar czf "$OUT/intf_${m}_points_$(grep -c '^points/' /tmp/intf-new)_$stamp.tgz" -T /tmp/intf-new
       find logs -newer /tmp/intf-stamp -type f 2> /dev/null > /tmp/intf-logs
       tar czf "$OUT/intf_${m}_logs_$stamp.tgz" -T /tmp/intf-logs
       tar czf "$OUT/intf_${m}_report_$stamp.tgz" results.md summary.json ./*.png 2> /dev/null)
      ls -la "$OUT";;
    replicas)  # 2 GPUs (nvidia-h200-x2): two device-mode replicas behind vllm-router vs one replica, then a drain
      # under load (REPLICA_MODEL, REPLICA_PROMPTS, REPLICA_ARGS, REPLICA_LOAD; docs/deploy.md). Needs .whl with
      # vllm-router (fetch_wheels.sh).
      model=${REPLICA_MODEL:-llama3-8b}; n=${REPLICA_PROMPTS:-400}
      bench() {  # URL TAG: all prompts at once, 512 in / 128 out
        timeout 300 python3 -m blink bench serve --base-url "$1" --num-prompts "$n" --request-rate inf \
          ${REPLICA_LOAD:---random-input-len 512 --random-output-len 128} --ignore-eos --disable-tqdm \
          --result-json "$OUT/replicas_$2.json" \
          | grep -E "Successful|Failed|Output token|TTFT|TPOT" | tee "$OUT/replicas_$2.txt"
      }
      for gpu in 0 1; do
        CUDA_VISIBLE_DEVICES=$gpu python3 -m blink serve --model "$model" ${REPLICA_ARGS:---engine device --max-model-len 1024} \
          --port 802$gpu --shutdown-timeout 120 > "$OUT/replica$gpu.log" 2>&1 &
        eval "srv$gpu=$!"
      done
      wait_healthy 8020 && wait_healthy 8021 || { tail -5 "$OUT"/replica*.log; }
      python3 -m vllm_router.launch_router --worker-urls http://127.0.0.1:8020 http://127.0.0.1:8021 \
        --policy ${REPLICA_POLICY:-round_robin} --port 8030 --prometheus-port 8031 --worker-startup-check-interval 1 \
        --health-check-interval-secs 1 --health-failure-threshold 1 --log-level warning > "$OUT/router.log" 2>&1 & rtr=$!
      wait_healthy 8030 60
      bench http://127.0.0.1:8020 one_replica
      bench http://127.0.0.1:8030 two_replicas
      curl -s localhost:8030/get_loads | tee "$OUT/replicas_loads.json"; echo
      bench http://127.0.0.1:8030 drain & load=$!  # replica 0 gets SIGTERM 5 s into this run
      sleep 5; kill -TERM $srv0; t0=$(date +%s)
      wait $srv0; echo "replica 0 exit $? after $(( $(date +%s) - t0 )) s"; grep -E "drain" "$OUT/replica0.log"
      wait $load
      kill -TERM $rtr; wait $rtr; stop_server $srv1;;
    moe-tests)  # issue 20: Phi-4 / Qwen3-30B-A3B real shapes vs HF, MoE kernels, device == host on a tiny MoE
      python3 -m pytest -q -s -m "gpu or not gpu" --timeout 900 tests/model/test_moe_phi_gpu.py tests/kernels/test_moe.py \
        tests/kernels/test_moe_compile_sm90.py 2>&1 | tee "$OUT/moe_tests.log" | tail -30;;
    moe-kernels) python3 -m bench.kernels.moe_block 2>&1 | tee "$OUT/moe_kernels.log";;
    moe-step) python3 -m blink.bench.step step --presets qwen3-30b-a3b,phi-4 --batches 1,8,32,128 \
        --result-json "$OUT/moe_step.json" 2>&1 | tee "$OUT/moe_step.log";;
    moe-serve)  # one serving point per mode for qwen3-30b-a3b (all requests at once)
      for engine in device host; do
        python3 -m blink serve --model qwen3-30b-a3b --engine $engine --max-model-len 1024 --port 8015 \
          > "/tmp/moe_serve_$engine.log" 2>&1 & srv=$!
        wait_healthy 8015 600
        timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --num-prompts 200 --request-rate inf \
          --random-input-len 512 --random-output-len 128 --ignore-eos --disable-tqdm \
          --result-json "$OUT/moe_serve_$engine.json" | grep -E "Successful|Failed|Output token|TTFT|TPOT"
        stop_server $srv
      done;;
    moe-interference)  # one interference point (8 req/s, isolated and spin x2) for qwen3-30b-a3b, both modes
      python3 -m blink bench interference --model qwen3-30b-a3b --modes "${MOE_MODES:-device,host}" --frontend-cpus 0-1 \
        --engine-cpus 2-7 --max-model-len 1024 --request-rates 8 --attack-levels 0,2 --attack-kinds spin \
        --point-seconds 20 --ignore-eos --random-input-len 512 --random-output-len 128 \
        --result-dir /tmp/moe-interference
      tar czf "$OUT/moe_interference.tgz" -C /tmp moe-interference;;
    allreduce)  # 2+ GPUs: NCCL vs the one-shot peer-to-peer all-reduce, bf16, decode to prefill sizes
      timeout 300 python3 -m blink bench allreduce --result-json "$OUT/allreduce.json" 2>&1 | tee "$OUT/allreduce.log";;
    cache-out)  # this machine's compiled Triton kernels (cubins + metadata: enough to load them) and blink's builds,
      # in <= 15 MiB parts: move the returned gpu_cache_* into .gpu_cache/ here and carry ".gpu_cache" next time
      (cd /tmp && { find triton-cache \( -name '*.cubin' -o -name '*.json' \) -print; ls -d blink-cache 2> /dev/null; }) \
        > /tmp/cache-list
      tar czf /tmp/caches.tgz -C /tmp -T /tmp/cache-list && split -b 15m -d /tmp/caches.tgz "$OUT/gpu_cache_"
      echo "triton cache $(du -sh /tmp/triton-cache | cut -f1) in $(ls /tmp/triton-cache | wc -l) kernels; carried: $(du -sh /tmp/caches.tgz | cut -f1)"
      ls -la "$OUT"/gpu_cache_*;;
    *) echo "unknown stage $stage";;
  esac
done
