"""Medians [min-max] of the front-end lab's interleaved runs (lab.sh): per variant and condition."""
import collections
import glob
import re
import statistics

rows = collections.defaultdict(lambda: collections.defaultdict(list))
run = re.compile(r"^(\w+) (isolated|spin\d+) r\d+ 300 TTFT p50 ([\d.]+) p99 ([\d.]+) TPOT p50 ([\d.]+) p99 ([\d.]+) ms "
                 r"fe CPU ([\d.]+) ms/req")
thread = re.compile(r"^(\w+) (isolated|spin\d+) r\d+ thread python (\d+) ticks (\d+) wakes")
for path in sorted(glob.glob("*.log")):
    pending = []
    for line in open(path):
        if m := thread.match(line):
            pending.append((int(m[3]), int(m[4])))
        elif m := run.match(line):
            r = rows[(m[2], m[1])]
            for key, value in zip(("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "fe_cpu_ms"), m.groups()[2:]):
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
