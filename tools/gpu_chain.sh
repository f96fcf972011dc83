#!/usr/bin/env bash
# Chains tools/gpu_run.sh stages under timeouts in one device call, then tars $OUT's logs into one file.
# Each argument: "[@CARD] [VAR=value ...] stage:seconds", "~" for a space inside a value. From the repository root:
#   bash tools/gpu_chain.sh "env:20" "GEMV_MS=2,8 gemv-proj:120" "LEVERS=baseline;gemv+pdl,~up~to~16~rows fusion-levers:240"
# @CARD (e.g. @H200, @H100) runs the stage only where nvidia-smi's card name holds CARD: one call can carry what
# only an H200 may measure (issue 19's matrix) and what to do instead on whichever card came.
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
for spec in "$@"; do
  if [[ $spec == @* ]]; then
    gate=${spec%% *}; spec=${spec#* }
    if [[ $card != *"${gate#@}"* ]]; then echo "##### skipped on ${card:-no GPU}: $gate $spec"; continue; fi
  fi
  read -r -a words <<< "$spec"
  last=${words[-1]}; stage=${last%%:*}; secs=${last##*:}
  echo "##### $spec ($(date +%T))"
  vars=("${words[@]:0:${#words[@]}-1}"); vars=("${vars[@]//\~/ }")  # ~ stands for a space in values
  env "${vars[@]}" timeout -k 5 "$secs" bash tools/gpu_run.sh "$stage" 2>&1 | tail -80
  echo "##### rc ${PIPESTATUS[0]}"
done
cd "$OUT" && tar czf "$OUT/logs_$(date +%H%M%S).tgz" --exclude='*.tgz' --exclude='gpu_cache*' . 2> /dev/null; ls -la "$OUT"
