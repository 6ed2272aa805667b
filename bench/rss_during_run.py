#!/usr/bin/env python3
"""Resident memory of a training run, step by step: runs CMD (a `roundpipe train ...
--output-dir OUTDIR`), samples its VmRSS every 0.5 s next to the number of rows in
OUTDIR/metrics.csv, and prints the largest sample per step (MiB). Writes OUTDIR.rss (time, step,
kB) and OUTDIR.log (the run's output). bench/results/host_memory_cpu.md was made with it:
    python3 bench/rss_during_run.py /tmp/run build/roundpipe train examples/specs/default.json \
        --steps 45 --output-dir /tmp/run
"""
import os
import subprocess
import sys
import time

out = sys.argv[1]; cmd = sys.argv[2:]
p = subprocess.Popen(cmd, stdout=open(out + ".log", "w"), stderr=subprocess.STDOUT)
rows = []
while p.poll() is None:
    try:
        rss = [l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]
    except Exception:
        break
    step = 0
    try:
        step = sum(1 for _ in open(os.path.join(out, "metrics.csv"))) - 1
    except Exception:
        pass
    rows.append((time.time(), step, int(rss)))
    time.sleep(0.5)
with open(out + ".rss", "w") as f:
    for r in rows: f.write(f"{r[0]:.1f} {r[1]} {r[2]}\n")
# per-step max rss
by = {}
for _, s, r in rows: by[s] = max(by.get(s, 0), r)
for s in sorted(by): print(s, by[s] / 1024, "MiB")
