#!/usr/bin/env bash
# Issue 19 item 3 without a GPU (docs/perf.md, 2026-12-01 session 7): the front end's TTFT with two spinners
# on its own core, and what helps. Zero-cost engine + client on core 0, front end alone on core 1.
#   bash tools/frontend_foothold.sh knobs   # isolated | spin x2 | at nice 19 | SCHED_IDLE | front end reniced -10
#   bash tools/frontend_foothold.sh flag    # blink serve with and without --frontend-nice -10
set -u
mode=${1:-flag}; PY=${PY:-.venv/bin/python}; OUTD=${OUTD:-/tmp/frontend_foothold}; mkdir -p "$OUTD"
start() {  # EXTRA_FLAGS...
  $PY -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port 8716 \
    --frontend-cpus 1 --engine-cpus 0 "$@" > "$OUTD/serve.log" 2>&1 & srv=$!
  for _ in $(seq 90); do curl -sf localhost:8716/health > /dev/null && break; sleep 1; done
}
point() {  # NAME none | ATTACK_FLAGS...
  local name=$1; shift; att=
  if [ "$1" != none ]; then
    $PY -m blink bench attack --kind spin --procs 2 --cpus 1 --duration 30 "$@" > /dev/null 2>&1 & att=$!; sleep 2
  fi
  taskset -c 0 $PY -m blink bench serve --base-url http://127.0.0.1:8716 --num-prompts 300 --request-rate 20 \
    --random-input-len 1 --random-output-len 128 --ignore-eos --disable-tqdm --result-json "$OUTD/r.json" > /dev/null 2>&1
  [ -n "$att" ] && { kill $att 2> /dev/null; wait $att 2> /dev/null; }
  $PY -c "import json; d = json.load(open('$OUTD/r.json')); print('$name', d['completed'], 'TTFT p50 %.2f p99 %.2f ms' % (d['median_ttft_ms'], d['p99_ttft_ms']))"
}
renice_frontend() {  # N: every thread of the front end
  local fe; fe=$(pgrep -f "blink.frontend.api_server.*8716" | head -1)
  for t in /proc/"$fe"/task/*; do renice -n "$1" -p "${t##*/}" > /dev/null; done
}
if [ "$mode" = knobs ]; then
  start
  for rep in 1 2; do
    point "isolated r$rep" none; point "spin2 r$rep" --nice 0; point "spin2_nice19 r$rep" --nice 19
    point "spin2_idle r$rep" --sched idle
    renice_frontend -10; point "spin2_frontend-10 r$rep" --nice 0; renice_frontend 0
  done
  kill -INT $srv; wait $srv
else
  for variant in default nice-10 default nice-10; do
    if [ $variant = nice-10 ]; then start --frontend-nice -10; else start; fi
    point "$variant isolated" none; point "$variant spin2" --nice 0
    kill -INT $srv; wait $srv
  done
fi
