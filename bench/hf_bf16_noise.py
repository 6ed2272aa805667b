#!/usr/bin/env python3
# Run from the repository root on a machine with torch + transformers (the lent GPU machine):
#   python3 bench/hf_bf16_noise.py tiny_llama tiny_gemma2 tiny_gemma3 ...
# (fixtures of tests/fixtures/hf_golden, made there by make_golden.py). It prints, per fixture,
# transformers' own bf16 error against its fp32 result on the tiny golden families: the noise
# floor a bf16 implementation is held to (logits and every gradient, relative L2)
import sys, torch, transformers
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
for name in sys.argv[1:]:
    path = f"tests/fixtures/hf_golden/{name}"
    res = {}
    ids = None
    for dt in (torch.float32, torch.bfloat16):
        m = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dt, attn_implementation="eager").to(dev)
        if ids is None:
            ids = torch.randint(0, m.config.vocab_size, (2, 24), device=dev)
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        res[dt] = (out.logits.float().detach(), {n: p.grad.float().detach() for n, p in m.named_parameters() if p.grad is not None})
    lf, gf = res[torch.float32]; lb, gb = res[torch.bfloat16]
    rel = lambda a, b: ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    gr = sorted(((rel(gb[n], gf[n]), n) for n in gf), reverse=True)
    print(f"{name}: logits {rel(lb, lf):.4f}; grads max {gr[0][0]:.4f} ({gr[0][1]}), median {gr[len(gr)//2][0]:.4f}")
