cd /work/main
for rep in 1 2; do
  for ol in 16 128; do
    OUT_LEN=$ol STEP_MS=10 RATE=24 SPINS= REPS=1 OUTD=/tmp/si/s$ol bash tools/frontend_foothold.sh lab 2>&1 | sed "s/^/out$ol /"
  done
done
