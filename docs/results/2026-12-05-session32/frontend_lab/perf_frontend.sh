cd /work/main
PY=.venv/bin/python; PORT=8716; OUT=/tmp/perf_fe; mkdir -p $OUT
export BLINK_NULL_STEP_MS=10
$PY -m blink serve --model llama3.2-1b --engine-module blink.bench.null_engine --port $PORT \
  --frontend-cpus 1 --engine-cpus 0 --disable-log-requests > $OUT/serve.log 2>&1 &
srv=$!
for _ in $(seq 90); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 1; done
fe=$(pgrep -P $srv -f blink.frontend.api_server | head -1)
bench() { taskset -c 0 $PY -m blink bench serve --base-url http://127.0.0.1:$PORT --num-prompts $1 \
  --request-rate 24 --random-input-len 1 --random-output-len 128 --ignore-eos --disable-tqdm --result-json $OUT/r.json > /dev/null 2>&1; }
bench 40
perf record -F 2000 -g -p $fe -o $OUT/perf.data > $OUT/perf.log 2>&1 &
pp=$!; sleep 1
bench 300
kill -INT $pp; wait $pp
kill -INT $srv; wait $srv
