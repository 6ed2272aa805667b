#!/usr/bin/env python3
# Run from the repository root where torch + transformers + peft exist:
#   python3 bench/peft_bf16_noise.py tiny_gemma2_lora tiny_gemma3_lora ...
# For each PEFT golden of tests/fixtures/hf_lora (make_lora_golden.py), PEFT's own bf16 error
# against its fp32 result on the golden's ids, targets and adapter weights: the noise floor a
# bf16 implementation's logits and adapter gradients are held to (relative L2).
import json, sys

import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

dev = "cuda" if torch.cuda.is_available() else "cpu"
for name in sys.argv[1:]:
    path = f"tests/fixtures/hf_lora/{name}"
    g = load_file(f"{path}/golden.safetensors")
    cfg = json.load(open(f"{path}/lora.json"))
    ids, targets = g["ids"].long().to(dev), g["targets"].long().to(dev)
    res = {}
    for dt in (torch.float32, torch.bfloat16):
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation="eager").to(dev)
        pm = get_peft_model(m, LoraConfig(r=cfg["r"], lora_alpha=cfg["alpha"], use_rslora=cfg["use_rslora"],
                                          target_modules=cfg["target_modules"], lora_dropout=0.0, bias="none"))
        lora = {}
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    key = "lora." + n.replace("base_model.model.", "", 1).replace(".default", "")
                    p.copy_(g[key].to(dt))
                    lora[n] = p
        logits = pm(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                                 ignore_index=-100, reduction="sum")
        loss.backward()
        res[dt] = (logits.float().detach(), {n: p.grad.float().detach() for n, p in lora.items()})
    lf, gf = res[torch.float32]
    lb, gb = res[torch.bfloat16]
    rel = lambda a, b: ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    gr = sorted(((rel(gb[n], gf[n]), n) for n in gf), reverse=True)
    print(f"{name} ({dev}): logits {rel(lb, lf):.4f}; adapter grads max {gr[0][0]:.4f} ({gr[0][1]}), "
          f"median {gr[len(gr) // 2][0]:.4f}")
