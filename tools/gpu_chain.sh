#!/usr/bin/env bash
# Chains tools/gpu_run.sh stages under timeouts in one device call, then tars $OUT's logs into one file.
# Each argument: "[VAR=value ...] stage:seconds", "~" for a space inside a value. From the repository root:
#   bash tools/gpu_chain.sh "env:20" "GEMV_MS=2,8 gemv-proj:120" "LEVERS=baseline;gemv+pdl,~up~to~16~rows fusion-levers:240"
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p "$OUT"
for spec in "$@"; do
  read -r -a words <<< "$spec"
  last=${words[-1]}; stage=${last%%:*}; secs=${last##*:}
  echo "##### $spec ($(date +%T))"
  vars=("${words[@]:0:${#words[@]}-1}"); vars=("${vars[@]//\~/ }")  # ~ stands for a space in values
  env "${vars[@]}" timeout -k 5 "$secs" bash tools/gpu_run.sh "$stage" 2>&1 | tail -80
  echo "##### rc ${PIPESTATUS[0]}"
done
cd "$OUT" && tar czf "$OUT/logs_$(date +%H%M%S).tgz" --exclude='*.tgz' --exclude='gpu_cache*' . 2> /dev/null; ls -la "$OUT"
