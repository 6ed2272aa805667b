#!/usr/bin/env python3
"""Resident PyTorch + transformers baseline for bench_throughput: the same model
shape with random weights fully on one GPU, bf16 autocast, gradient checkpointing, fused
AdamW. Prints tokens/s (median step after warm-up), MFU by the same formula, peak memory.
    python3 bench/pytorch_baseline.py [--layers 28 --seq 8192 --seqs 8 --micro 8 --steps 6]
"""
import argparse
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=28)
p.add_argument("--hidden", type=int, default=2048)
p.add_argument("--heads", type=int, default=16)
p.add_argument("--kv-heads", type=int, default=8)
p.add_argument("--head-dim", type=int, default=128)
p.add_argument("--ffn", type=int, default=6144)
p.add_argument("--vocab", type=int, default=151936)
p.add_argument("--seq", type=int, default=8192)
p.add_argument("--seqs", type=int, default=8)
p.add_argument("--micro", type=int, default=8)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--results", default="")
a = p.parse_args()

cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                  num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                  max_position_embeddings=max(a.seq, 40960), tie_word_embeddings=True, rope_theta=1e6)
cfg._attn_implementation = "sdpa"
model = Qwen3ForCausalLM(cfg).cuda()
model.gradient_checkpointing_enable()
model.config.use_cache = False
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
per_micro = a.seqs // a.micro
times = []
for step in range(a.warmup + a.steps):
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(a.micro):
        ids = torch.randint(0, a.vocab, (per_micro, a.seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        (out.loss / a.micro).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.time() - t0)
    print(f"step {step} loss {out.loss.item():.4f} ({times[-1]:.2f} s)", flush=True)
dt = statistics.median(times[a.warmup:])
tps = a.seqs * a.seq / dt
nmat = a.layers * (a.hidden * a.heads * a.head_dim * 2 + 2 * a.hidden * a.kv_heads * a.head_dim + 3 * a.hidden * a.ffn) \
    + a.vocab * a.hidden
mfu = tps * (6 * nmat + 6 * a.layers * a.heads * a.head_dim * a.seq) / 790e12
peak = torch.cuda.max_memory_allocated() / 2**30
print(f"RESULT tokens/s {tps:.1f}  MFU {mfu:.3f}  peak GPU memory {peak:.2f} GiB  step {dt:.3f} s")
if a.results:
    with open(a.results, "a") as f:
        f.write(f"| pytorch resident (1 x cuda, fp32 master, bf16 autocast) | {tps:.0f} | {mfu:.3f} | {peak:.2f} | {dt:.2f} |\n")
