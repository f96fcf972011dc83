#!/usr/bin/env bash
# front end alone on core 1 (engine: null, paced BLINK_NULL_STEP_MS; client on core 0), 24 req/s x 128 tokens.
# usage: lab.sh LABEL REPS   -> per rep: isolated and spin x2 on the front end's core
set -u
REPO=${REPO:-/work/main}; cd $REPO; PY=.venv/bin/python; OUT=/tmp/fe; label=$1; reps=${2:-2}
export BLINK_NULL_STEP_MS=${STEP_MS:-10}
$PY -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port 8716 \
    --frontend-cpus 1 --engine-cpus 0 --disable-log-requests > $OUT/serve_$label.log 2>&1 & srv=$!
for _ in $(seq 90); do curl -sf localhost:8716/health > /dev/null && break; sleep 1; done
kill -0 $srv 2> /dev/null || { echo "SERVER FAILED: $(tail -1 $OUT/serve_*.log)"; exit 1; }
ps -o args= -p $(pgrep -f "blink.frontend.api_server.*8716" | head -1) | grep -q "^$REPO\|^\.venv\|^$PWD" || { echo "WRONG SERVER"; exit 1; }
fe=$(pgrep -f "blink.frontend.api_server.*8716" | head -1)
cpu() { awk '{print $14+$15}' /proc/$fe/stat; }
threads() { for t in /proc/$fe/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat) $(awk '/^voluntary_ctxt/{print $2}' $t/status)"; done; }
run() {  # NAME
  c0=$(cpu); threads > $OUT/t0
  taskset -c 0 $PY -m blink bench serve --base-url http://127.0.0.1:8716 --num-prompts ${N:-300} --request-rate ${RATE:-24} \
    --random-input-len 1 --random-output-len 128 --ignore-eos --disable-tqdm --result-json $OUT/r.json > /dev/null 2>&1
  c1=$(cpu); threads > $OUT/t1; paste $OUT/t0 $OUT/t1 | awk '{d=$5-$2; w=$6-$3; if (d>2) printf "%s %s thread %s %d ticks %d wakes\n", "'$label'", "'"$1"'", $1, d, w}' 
  $PY -c "import json; d=json.load(open('$OUT/r.json')); print('$label', '$1', d['completed'], 'TTFT p50 %.2f p99 %.2f TPOT p50 %.2f p99 %.2f ms' % (d['median_ttft_ms'], d['p99_ttft_ms'], d['median_tpot_ms'], d['p99_tpot_ms']), 'fe CPU %.2f ms/req' % (($c1-$c0)*10/${N:-300}))"
}
N=40 run warm > /dev/null
if [ -n "${PROF:-}" ]; then (sleep 3; /work/main/.venv/bin/py-spy record -p $fe -o $OUT/prof_$label.txt -f raw -r 1000 -d 8 --gil > /dev/null 2>&1) & fi
for rep in $(seq $reps); do
  run "isolated r$rep"
  [ -n "${ISO_ONLY:-}" ] && continue
  $PY -m blink bench attack --kind spin --procs ${SPIN:-2} --cpus 1 --duration 40 --nice 0 > /dev/null 2>&1 & att=$!; sleep 2
  run "spin${SPIN:-2} r$rep"
  kill $att 2> /dev/null; wait $att 2> /dev/null
done
kill -INT $srv; wait $srv
