#!/usr/bin/env bash
# Issue 19 item 3 without a GPU: the front end's TTFT and CPU with spinners on its own core, and what helps.
# Zero-cost engine on ENGINE_CPU, client on CLIENT_CPU, the front end alone on FE_CPU (defaults 0, 0, 1).
#   bash tools/frontend_foothold.sh knobs   # isolated | spin x2 | at nice 19 | SCHED_IDLE | front end reniced -10
#   bash tools/frontend_foothold.sh flag    # blink serve with and without --frontend-nice -10
#   STEP_MS=10 RATE=24 bash tools/frontend_foothold.sh lab   # perf.md, session 30: the engine paced like decode
#       steps; per rep isolated then spin x each of SPINS ("2 8"); prints the front end's CPU a request and
#       each of its busy threads' CPU ticks and wake-ups (the egress reader: the one with the most wake-ups);
#       RENICE=-10 adds the spin points with the front end reniced (root, or a raised RLIMIT_NICE)
#   SERVE_FLAGS="--stream-interval 4": more flags for blink serve (every mode)
# Every point: N requests (300) at RATE req/s (20), 1-token prompts, OUT_LEN (128) streamed tokens, ignore EOS.
set -u
mode=${1:-flag}; PY=${PY:-.venv/bin/python}; OUTD=${OUTD:-/tmp/frontend_foothold}; mkdir -p "$OUTD"
FE_CPU=${FE_CPU:-1}; ENGINE_CPU=${ENGINE_CPU:-0}; CLIENT_CPU=${CLIENT_CPU:-0}; PORT=${PORT:-8716}
[ -n "${STEP_MS:-}" ] && export BLINK_NULL_STEP_MS=$STEP_MS
start() {  # EXTRA_FLAGS...
  $PY -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port "$PORT" \
    --frontend-cpus "$FE_CPU" --engine-cpus "$ENGINE_CPU" --disable-log-requests ${SERVE_FLAGS:-} "$@" \
    > "$OUTD/serve.log" 2>&1 &
  srv=$!
  for _ in $(seq 90); do curl -sf "localhost:$PORT/health" > /dev/null && break; sleep 1; done
  # a server left from another run would answer in our place: refuse to measure it
  kill -0 $srv 2> /dev/null || { echo "frontend_foothold: the server did not start: $(tail -1 "$OUTD/serve.log")"; exit 1; }
  fe=$(pgrep -P "$srv" -f "blink.frontend.api_server" | head -1)
  [ -n "$fe" ] || { echo "frontend_foothold: no front end under the server"; exit 1; }
}
threads() {  # each thread of the front end: CPU ticks and voluntary context switches (wake-ups)
  for t in /proc/"$fe"/task/*; do
    echo "${t##*/} $(awk '{print $14 + $15}' "$t/stat") $(awk '/^voluntary_ctxt/ {print $2}' "$t/status")"
  done
}
point() {  # NAME none | ATTACK_FLAGS...
  local name=$1; shift; att=
  if [ "$1" != none ]; then
    $PY -m blink bench attack --kind spin --cpus "$FE_CPU" --duration 60 "$@" > /dev/null 2>&1 & att=$!; sleep 2
  fi
  threads > "$OUTD/t0"; c0=$(awk '{print $14 + $15}' /proc/"$fe"/stat)
  taskset -c "$CLIENT_CPU" $PY -m blink bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "${N:-300}" \
    --request-rate "${RATE:-20}" --random-input-len 1 --random-output-len "${OUT_LEN:-128}" --ignore-eos \
    --disable-tqdm --result-json "$OUTD/r.json" > /dev/null 2>&1
  c1=$(awk '{print $14 + $15}' /proc/"$fe"/stat); threads > "$OUTD/t1"
  [ -n "$att" ] && { kill $att 2> /dev/null; wait $att 2> /dev/null; }
  join "$OUTD/t0" "$OUTD/t1" | awk -v n="$name" '$4 - $2 > 2 {printf "%s thread %s %d ticks %d wakes\n", n, $1, $4 - $2, $5 - $3}'
  $PY -c "import json; d = json.load(open('$OUTD/r.json')); print('$name', d['completed'], 'TTFT p50 %.2f p99 %.2f TPOT p50 %.2f p99 %.2f ms' % (d['median_ttft_ms'], d['p99_ttft_ms'], d['median_tpot_ms'], d['p99_tpot_ms']), 'fe CPU %.2f ms/req' % (($c1 - $c0) * 1000 / $(getconf CLK_TCK) / ${N:-300}))"
}
renice_frontend() {  # N: every thread of the front end
  for t in /proc/"$fe"/task/*; do renice -n "$1" -p "${t##*/}" > /dev/null; done
}
if [ "$mode" = knobs ]; then
  start
  for rep in 1 2; do
    point "isolated r$rep" none; point "spin2 r$rep" --procs 2 --nice 0; point "spin2_nice19 r$rep" --procs 2 --nice 19
    point "spin2_idle r$rep" --procs 2 --sched idle
    renice_frontend -10; point "spin2_frontend-10 r$rep" --procs 2 --nice 0; renice_frontend 0
  done
  kill -INT $srv; wait $srv
elif [ "$mode" = lab ]; then
  start
  N=40 point warm none > /dev/null
  for rep in $(seq "${REPS:-2}"); do
    point "isolated r$rep" none
    for procs in ${SPINS:-2 8}; do point "spin$procs r$rep" --procs "$procs" --nice 0; done
    if [ -n "${RENICE:-}" ]; then  # the same spin points with the front end at niceness RENICE (e.g. -10)
      renice_frontend "$RENICE"
      for procs in ${SPINS:-2 8}; do point "spin$procs nice$RENICE r$rep" --procs "$procs" --nice 0; done
      renice_frontend 0
    fi
  done
  kill -INT $srv; wait $srv
else
  for variant in default nice-10 default nice-10; do
    if [ $variant = nice-10 ]; then start --frontend-nice -10; else start; fi
    point "$variant isolated" none; point "$variant spin2" --procs 2 --nice 0
    kill -INT $srv; wait $srv
  done
fi
