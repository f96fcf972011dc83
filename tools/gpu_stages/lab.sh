# shellcheck shell=bash
# Sourced by tools/gpu_run.sh: the interference lab: its matrices and their chunks, TP and prefix-cache interference.
# stages_lab STAGE runs that stage and returns its status, or 99 for a stage not in this file.
stages_lab() {
  case $1 in
    interference) python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 \
        --engine-cpus 2-7 --request-rates 2,8,16,32 --attack-levels 0,2 --attack-kinds spin --point-seconds 30 \
        --ignore-eos --random-input-len 512 --random-output-len 128 --result-dir /tmp/interference;
      tar czf "$OUT/interference.tgz" -C /tmp interference;;  # $OUT returns at most 8 files
    tp-interference)  # 2 GPUs: serving at TP=2 under attack, ranks on cores 2 and 3; TPI_WHERE: rank1 (core 3) and/or all
      for where in ${TPI_WHERE:-rank1 all}; do
        if [ "$where" = rank1 ]; then cpus=3; levels=0,2; else cpus=2-3; levels=2; fi
        python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 --engine-cpus 2-3 \
          --attack-cpus $cpus --serve-args "-tp 2 --rank-cpus '2;3'" --max-model-len 1024 --request-rates 8,32 \
          --attack-levels $levels --attack-kinds spin --point-seconds 15 --ignore-eos --random-input-len 512 \
          --random-output-len 128 --result-dir /tmp/tpi-$where 2>&1 | grep --line-buffered -v "it/s"
        tar czf "$OUT/tp_interference_$where.tgz" -C /tmp tpi-$where
      done;;
    prefix-interference)  # the shared-prefix workload, device vs host, under the interference lab's CPU attack
      python3 -m blink bench interference --model llama3-8b --modes device,host --frontend-cpus 0-1 --engine-cpus 2-7 \
        --max-model-len 4096 --request-rates "${PREFIX_RATES:-2,8}" --attack-levels 0,2 --attack-kinds spin \
        --point-seconds "${PREFIX_POINT_S:-30}" --ignore-eos --random-prefix-len 2000 --random-input-len 100 --random-output-len 128 \
        --result-dir /tmp/prefix-interference
      tar czf "$OUT/prefix_interference.tgz" -C /tmp prefix-interference;;
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
      # INTF_GPU: the card the folder's points come from (all H200 so far); another card measures nothing
      python3 -m blink bench interference --model llama3-8b --matrix "priority${m#p}" --frontend-cpus 0-1 \
        --require-gpu "${INTF_GPU:-H200}" \
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
    moe-interference)  # one interference point (8 req/s, isolated and spin x2) for qwen3-30b-a3b, both modes
      python3 -m blink bench interference --model qwen3-30b-a3b --modes "${MOE_MODES:-device,host}" --frontend-cpus 0-1 \
        --engine-cpus 2-7 --max-model-len 1024 --request-rates 8 --attack-levels 0,2 --attack-kinds spin \
        --point-seconds 20 --ignore-eos --random-input-len 512 --random-output-len 128 \
        --result-dir /tmp/moe-interference
      tar czf "$OUT/moe_interference.tgz" -C /tmp moe-interference;;
    *) return 99;;
  esac
}
