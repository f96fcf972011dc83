# shellcheck shell=bash
# Sourced by tools/gpu_run.sh: device mode's GPU loop (the self-test, the control gap, arrivals, idle power), TP and its barrier.
# stages_device STAGE runs that stage and returns its status, or 99 for a stage not in this file.
stages_device() {
  case $1 in
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
    allreduce)  # 2+ GPUs: NCCL vs the one-shot peer-to-peer all-reduce, bf16, decode to prefill sizes
      timeout 300 python3 -m blink bench allreduce --result-json "$OUT/allreduce.json" 2>&1 | tee "$OUT/allreduce.log";;
    *) return 99;;
  esac
}
