#!/usr/bin/env bash
# profile the front end at the lab's isolated point: py-spy raw stacks of the whole front end
cd ${REPO:-/work/main}
PY=.venv/bin/python; PORT=${PORT:-8716}; OUT=${OUT:-/tmp/prof_fe}; mkdir -p $OUT
export BLINK_NULL_STEP_MS=10
$PY -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port $PORT \
  --frontend-cpus 1 --engine-cpus 0 --disable-log-requests > $OUT/serve.log 2>&1 &
srv=$!
for _ in $(seq 90); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 1; done
fe=$(pgrep -P $srv -f blink.frontend.api_server | head -1)
bench() { taskset -c 0 $PY -m blink bench serve --base-url http://127.0.0.1:$PORT --num-prompts $1 \
  --request-rate 24 --random-input-len 1 --random-output-len 128 --ignore-eos --disable-tqdm --result-json $OUT/r.json > /dev/null 2>&1; }
bench 40
c0=$(awk '{print $14 + $15}' /proc/$fe/stat)
if [ -n "${PROFILE:-}" ]; then
  py-spy record --pid $fe --rate 500 --format raw --threads ${NATIVE:+--native} ${GIL:+--gil} -o $OUT/raw.txt --nonblocking > $OUT/pyspy.log 2>&1 &
  sp=$!; sleep 1
fi
bench ${N:-300}
c1=$(awk '{print $14 + $15}' /proc/$fe/stat)
[ -n "${PROFILE:-}" ] && { kill -INT $sp; wait $sp; }
$PY -c "import json; d = json.load(open('$OUT/r.json')); print('${LABEL:-x}', d['completed'], 'TTFT p50 %.2f p99 %.2f TPOT p50 %.2f' % (d['median_ttft_ms'], d['p99_ttft_ms'], d['median_tpot_ms']), 'fe CPU %.2f ms/req' % (($c1 - $c0) * 1000 / $(getconf CLK_TCK) / ${N:-300}))"
kill -INT $srv; wait $srv
