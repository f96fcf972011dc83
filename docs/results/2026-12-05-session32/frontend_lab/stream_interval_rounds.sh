cd /work/main
for rep in ${REPS_LIST:-1 2 3}; do
  for si in 1 4; do
    echo "== rep $rep stream-interval $si"
    SERVE_FLAGS="--stream-interval $si" STEP_MS=10 RATE=24 SPINS=8 REPS=1 OUTD=/tmp/si/o$si bash tools/frontend_foothold.sh lab 2>&1 | grep -v thread
  done
done
