#!/usr/bin/env python3
"""Helpers of bench/async_lr_sweep.sh (python3 standard library only).

    async_lr_sweep.py spec BASE.json OUT.json --lr LR --warmup W --steps N --mode sync|async
                      --backend B --output-dir D [--tiny-model M --tiny-data F] [--async-extra JSON]
    async_lr_sweep.py text-data JSONL OUT.jsonl N     (assistant texts of a chat JSONL as text rows)
    async_lr_sweep.py table SWEEP_DIR                 (markdown table + CSV of the finished runs)

`spec` derives one run's spec from an example spec: peak lr LR (a cosine schedule keeps the
example's min_lr / lr ratio), W warmup steps, N steps, the optimizer mode, evaluation only
after the last step, no sample prompt, no merged copy, no TensorBoard files; everything else
(seed, data, batch shape, LoRA settings) stays as the example has it, so sync and async runs
of one grid point differ only in "async".
"""
import csv
import json
import math
import os
import sys

WINDOW = 20  # final-N-step mean of the training loss


def cmd_spec(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="async_lr_sweep.py spec")
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--mode", choices=["sync", "async"], required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--tiny-model")
    ap.add_argument("--tiny-data")
    ap.add_argument("--async-extra", default="")
    a = ap.parse_args(argv)
    with open(a.base) as f:
        s = json.load(f)
    base_lr = s.get("optimizer", {}).get("lr", 1e-4)
    sched = dict(s.get("lr_schedule", {"kind": "constant"}))
    if "min_lr" in sched:
        sched["min_lr"] = sched["min_lr"] / base_lr * a.lr if base_lr > 0 else 0.0
    sched.pop("lr", None)
    sched.pop("total_steps", None)
    sched["warmup_steps"] = a.warmup
    s["lr_schedule"] = sched
    s.setdefault("optimizer", {})["lr"] = a.lr
    s["steps"] = a.steps
    s["async"] = a.mode == "async"
    s["backend"] = a.backend
    s["output_dir"] = a.output_dir
    s["overwrite_output_dir"] = True
    s["eval_every"] = 0          # evaluate once, after the last step
    s["tensorboard"] = False
    s["merge_adapters"] = False
    s["save_every"] = 0
    s.pop("sample_prompt", None)
    if a.tiny_model:
        s["model"] = a.tiny_model
        s["data"] = a.tiny_data
        s["seq_len"] = 64
    if a.mode == "async" and a.async_extra:
        s.update(json.loads(a.async_extra))
    s["comment"] = (f"bench/async_lr_sweep.sh: {os.path.basename(a.base)} at peak lr {a.lr:g}, "
                    f"{a.warmup} warmup steps, {a.steps} steps, {a.mode}")
    with open(a.out, "w") as f:
        json.dump(s, f, indent=2)


def cmd_text_data(argv):
    src, out, n = argv[0], argv[1], int(argv[2])
    rows = []
    with open(src) as f:
        for line in f:
            if len(rows) >= n:
                break
            msgs = json.loads(line).get("messages", [])
            text = " ".join(m["content"] for m in msgs if m.get("role") == "assistant")
            if text:
                rows.append({"text": text})
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run_result(run_dir):
    """(final-20-step mean loss, final eval loss, steps) of a finished run, or None."""
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(os.path.join(run_dir, "done")) or not os.path.exists(path):
        return None
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    losses = [float(r["loss"]) for r in rows]
    tail = losses[-WINDOW:]
    evals = [float(r["eval_loss"]) for r in rows if r.get("eval_loss")]
    return sum(tail) / len(tail), (evals[-1] if evals else float("nan")), len(rows)


def fmt(x, spec=".4f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def cmd_table(argv):
    sweep = argv[0]
    points = {}
    for name in sorted(os.listdir(sweep)):
        # run folders: <job>_lr<lr>_w<warmup>_<mode>
        parts = name.rsplit("_", 3)
        if len(parts) != 4 or not parts[1].startswith("lr") or not parts[2].startswith("w"):
            continue
        job, lr, warm, mode = parts[0], float(parts[1][2:]), int(parts[2][1:]), parts[3]
        points.setdefault((job, lr, warm), {})[mode] = run_result(os.path.join(sweep, name))
    lines = ["| job | peak lr | warmup | sync loss (final 20) | async loss (final 20) | async - sync | "
             "sync eval | async eval | within 2% |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    best = {}
    for (job, lr, warm) in sorted(points):
        p = points[(job, lr, warm)]
        s, a = p.get("sync"), p.get("async")
        gap = (a[0] / s[0] - 1) if s and a and s[0] > 0 else None
        ok = None if gap is None else gap <= 0.02
        lines.append(f"| {job} | {lr:g} | {warm} | {fmt(s and s[0])} | {fmt(a and a[0])} | "
                     f"{'n/a' if gap is None else f'{gap * 100:+.1f}%'} | {fmt(s and s[1])} | "
                     f"{fmt(a and a[1])} | {'n/a' if ok is None else ('yes' if ok else 'no')} |")
        rows.append([job, lr, warm, s and s[0], a and a[0], gap, s and s[1], a and a[1]])
        if ok is not None:
            b = best.setdefault((job, warm), {"max_ok": None, "first_bad": None})
            if ok and b["first_bad"] is None:
                b["max_ok"] = lr
            elif not ok and b["first_bad"] is None:
                b["first_bad"] = lr
    lines.append("")
    for (job, warm), b in sorted(best.items()):
        upto = "none of the grid" if b["max_ok"] is None else format(b["max_ok"], "g")
        above = "" if b["first_bad"] is None else " (first lr that is not: %g)" % b["first_bad"]
        lines.append(f"- {job}, warmup {warm}: async within 2% of sync up to peak lr {upto}{above}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(sweep, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(sweep, "table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "peak_lr", "warmup", "sync_loss_final20", "async_loss_final20", "rel_gap",
                    "sync_eval_loss", "async_eval_loss"])
        for r in rows:
            w.writerow(["" if x is None else x for x in r])
    sys.stdout.write(text)


if __name__ == "__main__":
    cmds = {"spec": cmd_spec, "text-data": cmd_text_data, "table": cmd_table}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
