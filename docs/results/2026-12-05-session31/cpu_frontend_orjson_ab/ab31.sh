#!/usr/bin/env bash
# interleaved A/B of the front end lab: base (acf07f9) vs new (main HEAD)
for r in 1 2 3; do
  for side in base new; do
    dir=/work/main; [ $side = base ] && dir=/tmp/base31
    (cd $dir && PY=.venv/bin/python STEP_MS=10 RATE=24 REPS=1 SPINS="2 8" OUTD=/tmp/fl_$side bash tools/frontend_foothold.sh lab 2>&1 | sed "s/^/$side round$r /")
  done
done
