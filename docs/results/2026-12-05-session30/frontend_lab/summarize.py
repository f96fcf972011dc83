"""Medians [min-max] of the front-end lab's interleaved runs: per variant and condition.

Variants: base (2555ce5), cad (the egress cadence alone, 7b79b33), new (cadence + merged deltas, 78fe734; in
rounds_d also the cadence's late-find rule, session 30's last egress_cadence.py), merge (merged deltas alone:
2555ce5 + 78fe734). isolated.log and rounds_a/b were written by lab.sh (a copy here), rounds_c/d by
tools/frontend_foothold.sh lab. From this folder: `python3 summarize.py isolated.log rounds_spin* rounds_b.log`
gives perf.md's first table, `python3 summarize.py rounds_c*` and `rounds_d*` the later ones."""
import collections
import glob
import re
import statistics
import sys

rows = collections.defaultdict(lambda: collections.defaultdict(list))
run = re.compile(r"^(\w+) (isolated|spin\d+) r\d+ 300 TTFT p50 ([\d.]+) p99 ([\d.]+) TPOT p50 ([\d.]+) p99 ([\d.]+) ms "
                 r"fe CPU ([\d.]+) ms/req")
thread = re.compile(r"^(\w+) (isolated|spin\d+) r\d+ thread \S+ (\d+) ticks (\d+) wakes")
for path in sorted({p for pattern in (sys.argv[1:] or ["*.log"]) for p in glob.glob(pattern)}):
    pending = []
    for line in open(path):
        if m := thread.match(line):
            pending.append((int(m[3]), int(m[4])))
        elif m := run.match(line):
            r = rows[(m[2], m[1])]
            keys = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "fe_cpu_ms")
            for key, value in zip(keys, m.groups()[2:], strict=True):
                r[key].append(float(value))
            if pending:  # the reader: the thread with the most wakes
                ticks, wakes = max(pending, key=lambda t: t[1])
                r["reader_cpu_s"].append(ticks / 100)
                r["reader_wakes"].append(wakes)
            pending = []


def fmt(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}] n={len(values)}"


for (cond, variant), r in sorted(rows.items()):
    print(cond, variant)
    for key, values in r.items():
        print(f"  {key:13s} {fmt(values)}")
