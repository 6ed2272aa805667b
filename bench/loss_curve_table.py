#!/usr/bin/env python3
"""Loss-curve comparison of training runs: 20-step window means of the training loss and every
evaluation, each candidate against a reference run, as markdown tables.

Usage: bench/loss_curve_table.py DIR REFERENCE CANDIDATE [CANDIDATE...]
DIR holds metrics_<name>.csv (a run's metrics.csv) for every name given; each candidate row is
followed by its relative difference to REFERENCE (candidate / reference - 1) per window and per
evaluation, and the largest such difference is printed last."""
import csv
import statistics
import sys


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def windows(rows, width=20):
    loss = [float(r["loss"]) for r in rows if r.get("loss") not in (None, "") and r["step"] != "0"]
    return [statistics.mean(loss[i:i + width]) for i in range(0, len(loss), width)]


def evals(rows):
    return [(int(r["step"]), float(r["eval_loss"])) for r in rows if r.get("eval_loss") not in (None, "")]


def rel(a, b):
    return (a / b - 1) * 100


def table(head, cols, rows_by_name, ref, cands):
    print(f"| {head} | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    print(f"| {ref} | " + " | ".join(f"{x:.4f}" for x in rows_by_name[ref]) + " |")
    worst = 0.0
    for c in cands:
        print(f"| {c} | " + " | ".join(f"{x:.4f}" for x in rows_by_name[c]) + " |")
        d = [rel(a, b) for a, b in zip(rows_by_name[c], rows_by_name[ref])]
        worst = max([worst] + [abs(x) for x in d])
        print(f"| {c} / {ref} - 1 | " + " | ".join(f"{x:+.2f}%" for x in d) + " |")
    print()
    return worst


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    d, ref, cands = argv[1], argv[2], argv[3:]
    runs = {k: load(f"{d}/metrics_{k}.csv") for k in [ref] + cands}
    w = {k: windows(v) for k, v in runs.items()}
    worst_w = table("steps", [f"{i * 20 + 1}-{i * 20 + 20}" for i in range(len(w[ref]))], w, ref, cands)
    e = {k: evals(v) for k, v in runs.items()}
    ev = {k: [x for _, x in v] for k, v in e.items()}
    worst_e = table("eval at step", [str(s) for s, _ in e[ref]], ev, ref, cands) if e[ref] else 0.0
    for k, v in runs.items():
        print(f"{k}: {sum(1 for r in v if r.get('skipped') not in ('', '0', None))} skipped steps")
    print(f"largest window difference {worst_w:.2f}%, largest evaluation difference {worst_e:.2f}%")


if __name__ == "__main__":
    main(sys.argv)
