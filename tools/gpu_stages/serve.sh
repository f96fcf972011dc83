# shellcheck shell=bash
# Sourced by tools/gpu_run.sh: serving: the front end, structured outputs, prefix caching, the HF peer, replicas, MoE serving.
# stages_serve STAGE runs that stage and returns its status, or 99 for a stage not in this file.
stages_serve() {
  case $1 in
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
    serve-gpu) python3 -m pytest -q -m gpu tests/frontend 2>&1 | tee "$OUT/serve_gpu.log" | tail -30;;
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
    frontend-lab)  # issue 19 item 3 on the GPU host's CPUs (no GPU used): the front end alone on core 2 against the
      # paced zero-cost engine (core 0; client on 1), isolated and under spin x2 / x8 on its core (perf.md, session 30);
      # first the cost of one 100 us sleep's wake-up here (16.6 us of CPU on the 2-core CI machine)
      python3 -c 'import resource, time
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter(); n = 0
while time.perf_counter() - t < 1: time.sleep(100e-6); n += 1
r1 = resource.getrusage(resource.RUSAGE_SELF)
print("sleep(100 us): %d a second, %.2f us of CPU each" % (n, (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e6))' \
        | sed "1s/^/SERVE_FLAGS=${SERVE_FLAGS:-} /" | tee -a "$OUT/frontend_lab.log"  # -a: a chain's second lab keeps the first's
      # RENICE: session 31 saw spin x8 starve the front end at nice 0 there (TTFT p50 87-245 ms); -10 by default
      PY=python3 FE_CPU=2 ENGINE_CPU=0 CLIENT_CPU=1 STEP_MS=10 RATE=24 REPS=${FRONTEND_LAB_REPS:-2} OUTD=/tmp/frontend_lab \
        RENICE=${FRONTEND_LAB_RENICE--10} \
        bash tools/frontend_foothold.sh lab 2>&1 | tee -a "$OUT/frontend_lab.log";;
    long-prompt)  # issue 17: the served TTFT of 30k-token prompts (llama3-8b, 16 out, one at a time) per LONG_CONFIGS entry
      # MODE:BLOCK:WS (WS: BLINK_PREFILL_WS, session 27's warp-specialised prefill); LONG_ARGS adds serve flags
      for cfg in ${LONG_CONFIGS:-device:16:0 device:128:1}; do
        IFS=: read -r mode bs ws <<< "$cfg"; tag="${mode}_b${bs}_ws${ws}"
        BLINK_PREFILL_WS=$ws python3 -m blink serve --model llama3-8b --engine "$mode" --max-model-len 32768 \
          --block-size "$bs" --port 8015 ${LONG_ARGS:-} > "$OUT/long_serve_$tag.log" 2>&1 & srv=$!
        wait_healthy 8015 240 $srv || die_server $srv "$OUT/long_serve_$tag.log" "long-prompt $tag"
        python3 -m blink bench serve --base-url http://127.0.0.1:8015 --num-prompts "${LONG_PROMPTS:-6}" \
          --max-concurrency 1 --random-input-len "${LONG_INPUT:-30000}" --random-output-len 16 --ignore-eos \
          --disable-tqdm --result-json "$OUT/long_prompt_$tag.json" | grep -E "Successful|Failed|TTFT|TPOT" \
          | tee "$OUT/long_prompt_$tag.txt"
        stop_server $srv
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
      # PREFIX_PROMPTS: requests per run, PREFIX_MULTITURN=0: the shared-prefix run only; PREFIX_BLOCK: the KV block size)
      for engine in ${PREFIX_ENGINES:-device host}; do
        for cache in ${PREFIX_CACHES:-enable no-enable}; do
          python3 -m blink serve --model llama3-8b --engine $engine --max-model-len 4096 --port 8015 \
            --block-size "${PREFIX_BLOCK:-16}" --$cache-prefix-caching > "$OUT/prefix_serve_${engine}_$cache.log" 2>&1 & srv=$!
          wait_healthy 8015
          timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --num-prompts "${PREFIX_PROMPTS:-200}" \
            --request-rate "${PREFIX_RATE:-4}" --random-prefix-len 2000 --random-input-len 100 --random-output-len 128 \
            --ignore-eos --disable-tqdm --result-json "$OUT/prefix_${engine}_${cache}_b${PREFIX_BLOCK:-16}.json" \
            | grep -E "Successful|Failed|hit rate|Output token|TTFT"
          # where the shared-prefix run's TTFT goes, from the server's side (sums and counts, seconds)
          curl -s localhost:8015/metrics | grep -E "^blink:(time_to_first_token|request_queue_time|request_prefill_time)_seconds_(sum|count)" \
            | tee "$OUT/prefix_${engine}_${cache}_b${PREFIX_BLOCK:-16}_metrics.txt"
          [ "${PREFIX_MULTITURN:-1}" = 0 ] || timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --dataset-name multi-turn \
            --multi-turn-turns 5 --random-prefix-len 500 --random-input-len 200 --random-output-len 128 \
            --num-prompts "${PREFIX_PROMPTS:-200}" --max-concurrency 40 --ignore-eos --disable-tqdm --seed 1 \
            --result-json "$OUT/multiturn_${engine}_${cache}_b${PREFIX_BLOCK:-16}.json" | grep -E "Successful|Failed|hit rate|Output token|TTFT"
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
    defaults-serve)  # after a change of defaults (the levers, the sampler): llama3-8b served at 24 req/s isolated, split
      # layout, both modes, 2 interleaved repeats, the priority-1 workload and cores; its points record the client's
      # own stalls beside any whole-server pause (results.md's pauses table)
      python3 -m blink bench interference --model llama3-8b --modes device,host --layouts split --request-rates 24 \
        --attack-levels 0 --repeats 2 --random-input-len 512 --random-output-len 128 --random-range-ratio 0.0 \
        --ignore-eos --frontend-cpus 0-1 --engine-cpus 2-13 --client-cpus 14-15 --point-seconds 15 --drain-seconds 8 \
        --server-start-s "${INTF_START_S:-90}" --disable-tqdm --result-dir /tmp/defaults-serve 2>&1 \
        | grep --line-buffered -v "it/s" | tee "$OUT/defaults_serve.log"
      tar czf "$OUT/defaults_serve.tgz" -C /tmp/defaults-serve points runs results.md;;
    energy-pace)  # issue 19's energy per token: defaults-serve's point with device mode also served at each decode pace
      # in PACE_MS (ms, comma separated: `--decode-pace-ms`, as mode device-paceN; N/B adds `--decode-pace-max-batch B`,
      # as mode device-paceNbB), at PACE_RATES, PACE_REPEATS interleaved repeats; --resume on the same machine
      # continues a cut plan (INTF_BUDGET s a call)
      pace=${PACE_MS:-12}; variants=()
      for spec in ${pace//,/ }; do
        ms=${spec%%/*}
        if [[ $spec == */* ]]; then b=${spec#*/}; variants+=(--mode-variant "device-pace${ms}b$b=device:--decode-pace-ms $ms --decode-pace-max-batch $b")
        else variants+=(--mode-variant "device-pace$ms=device:--decode-pace-ms $ms"); fi
      done
      python3 -m blink bench interference --model llama3-8b --modes "${PACE_MODES:-device,host}" "${variants[@]}" \
        --layouts split --request-rates "${PACE_RATES:-24}" --attack-levels 0 --repeats "${PACE_REPEATS:-2}" \
        --random-input-len 512 --random-output-len 128 --random-range-ratio 0.0 --ignore-eos --frontend-cpus 0-1 \
        --engine-cpus 2-13 --client-cpus 14-15 --point-seconds 15 --drain-seconds 8 --resume \
        --server-start-s "${INTF_START_S:-90}" --time-budget-s "${INTF_BUDGET:-500}" --disable-tqdm \
        --result-dir /tmp/energy-pace 2>&1 | grep --line-buffered -v "it/s" | tee -a "$OUT/energy_pace.log"
      tar czf "$OUT/energy_pace.tgz" -C /tmp/energy-pace points runs results.md;;
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
    moe-serve)  # one serving point per mode for qwen3-30b-a3b (all requests at once); MOE_SERVE_MODES: "device host"
      for engine in ${MOE_SERVE_MODES:-device host}; do
        python3 -m blink serve --model qwen3-30b-a3b --engine $engine --max-model-len 1024 --port 8015 \
          > "/tmp/moe_serve_$engine.log" 2>&1 & srv=$!
        wait_healthy 8015 600
        timeout 300 python3 -m blink bench serve --base-url http://127.0.0.1:8015 --num-prompts 200 --request-rate inf \
          --random-input-len 512 --random-output-len 128 --ignore-eos --disable-tqdm \
          --result-json "$OUT/moe_serve_$engine.json" | grep -E "Successful|Failed|failed x|Output token|TTFT|TPOT"
        stop_server $srv
      done;;
    *) return 99;;
  esac
}
