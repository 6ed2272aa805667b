#!/usr/bin/env python3
"""Tables of bench/device_fp16_accumulation.sh's runs: 20-step window means of the training loss
and every evaluation, fp16 accumulation against fp32 accumulation (both with f16 compute).
Usage: bench/fp16_accumulation_table.py DIR (holding metrics_<dtype>_<acc>.csv)."""
import csv
import statistics
import sys

runs = {}
for key in ("bf16_f32", "f16_f32", "f16_f16"):
    with open(f"{sys.argv[1]}/metrics_{key}.csv") as f:
        runs[key] = list(csv.DictReader(f))


def windows(rows):
    loss = [float(r["loss"]) for r in rows if r.get("loss") not in (None, "") and r["step"] != "0"]
    return [statistics.mean(loss[i:i + 20]) for i in range(0, len(loss), 20)]


def evals(rows):
    return [(int(r["step"]), float(r["eval_loss"])) for r in rows if r.get("eval_loss") not in (None, "")]


w = {k: windows(v) for k, v in runs.items()}
print("| steps | " + " | ".join(f"{i * 20 + 1}-{i * 20 + 20}" for i in range(len(w["f16_f32"]))) + " |")
print("|---" * (len(w["f16_f32"]) + 1) + "|")
for k in runs:
    print(f"| {k} | " + " | ".join(f"{x:.4f}" for x in w[k]) + " |")
print("| f16 acc / f32 acc - 1 | " + " | ".join(f"{(a / b - 1) * 100:+.2f}%" for a, b in zip(w["f16_f16"], w["f16_f32"])) + " |")
print()
e = {k: evals(v) for k, v in runs.items()}
print("| eval at step | " + " | ".join(str(s) for s, _ in e["f16_f32"]) + " |")
print("|---" * (len(e["f16_f32"]) + 1) + "|")
for k in runs:
    print(f"| {k} | " + " | ".join(f"{x:.4f}" for _, x in e[k]) + " |")
print("| f16 acc / f32 acc - 1 | " + " | ".join(f"{(a[1] / b[1] - 1) * 100:+.2f}%" for a, b in zip(e["f16_f16"], e["f16_f32"])) + " |")
for k, v in runs.items():
    print(f"{k}: {sum(1 for r in v if r.get('skipped') not in ('', '0', None))} skipped steps")
