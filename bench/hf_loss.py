#!/usr/bin/env python3
"""Loss of a Hugging Face checkpoint on a batch dumped by `roundpipe train --dump-batch`:
    python3 bench/hf_loss.py HF_DIR BATCH.json
Prints the mean token cross-entropy (sum over targets != -100 / their count) in fp32 and
with bf16 weights, computed by transformers (eager attention), for comparison with the
first-step loss RoundPipe prints for the same batch (with the async optimizer, step 1
uses the initial weights)."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

d, batch = sys.argv[1], json.load(open(sys.argv[2]))
ids = torch.tensor(batch["ids"]).view(batch["n_seq"], batch["seq_len"])
tg = torch.tensor(batch["targets"]).view(batch["n_seq"], batch["seq_len"])
dev = "cuda" if torch.cuda.is_available() else "cpu"
for dtype in (torch.float32, torch.bfloat16):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager").to(dev)
    with torch.no_grad():
        logits = m(input_ids=ids.to(dev)).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), tg.view(-1).to(dev),
                                                 ignore_index=-100, reduction="sum")
    n = int((tg >= 0).sum())
    print(f"HF_LOSS {str(dtype).split('.')[-1]} {loss.item() / n:.6f} over {n} tokens")
