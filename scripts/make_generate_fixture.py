#!/usr/bin/env python3
"""Greedy generations of Hugging Face transformers for tests/model/test_generate.cpp
(GreedySmolLM2EqualsTransformers): tests/fixtures/generate/smollm2_greedy.json.

Run where torch and transformers are installed (the lent GPU machine has them), on the
default model converted to a Hugging Face folder in f32 (the dequantized GGUF values):
    build/roundpipe convert assets/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-f32 --dtype f32
    python3 scripts/make_generate_fixture.py /tmp/smollm2-f32 tests/fixtures/generate/smollm2_greedy.json
For each prompt (chat messages through the model's chat template with the generation prompt,
or plain text) it records the prompt ids and transformers' greedy output ids
(do_sample=False, stopping at the model's eos as generate does): "cpu_f32" on the CPU in
float32, and "cuda_bf16" on the GPU in bfloat16 when CUDA is available.
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

src, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(src)
CASES = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"messages": [{"role": "user", "content": "Recite Genesis 1:1 from the King James Bible."}]},
    {"messages": [{"role": "system", "content": "You answer in one short sentence."},
                  {"role": "user", "content": "Why is the sky blue?"}]},
    {"text": "In the beginning God created"},
]
MAX_NEW = 32


def prompt_ids(case):
    if "messages" in case:
        ids = tok.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    return tok(case["text"])["input_ids"]


def run(device, dtype):
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=dtype).to(device).eval()
    eos = model.generation_config.eos_token_id
    rows = []
    for case in CASES:
        ids = prompt_ids(case)
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids], device=device), max_new_tokens=MAX_NEW, do_sample=False,
                                 num_beams=1, pad_token_id=tok.eos_token_id)
        rows.append({"prompt": case, "prompt_ids": ids, "max_new_tokens": MAX_NEW,
                     "output_ids": gen[0, len(ids):].tolist(), "eos": eos if isinstance(eos, list) else [eos]})
    return rows


res = {"transformers": transformers.__version__, "torch": torch.__version__, "cpu_f32": run("cpu", torch.float32)}
if torch.cuda.is_available():
    res["cuda_bf16"] = run("cuda", torch.bfloat16)
with open(out, "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")
print(f"wrote {out}: {len(CASES)} prompts, {'with' if 'cuda_bf16' in res else 'without'} cuda_bf16")
