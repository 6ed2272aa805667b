#!/usr/bin/env python3
"""Writes a tiny LLaMA model folder for quick CPU runs of the benches (python3 stdlib only).

    bench/tiny_model.py OUT_DIR [--seed S]

OUT_DIR gets config.json (llama: vocab 300, hidden 64, 2 layers, 4 heads of 16, 2 KV heads,
MLP 128, untied LM head), model.safetensors (fp32; matrices ~ N(0, 0.02^2) from Python's
seeded `random`, norms 1) and tokenizer.json (byte-level BPE without merges: id 0 is
<|endoftext|>, byte b is id 1 + b), the same tokenizer as the tests' tiny model
(tests/cli/cli_util.hpp). OUT_DIR must not exist or be empty.
"""
import argparse
import array
import json
import os
import random
import struct
import sys

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 300, 64, 128, 2, 4, 2, 16


def byte_level_vocab():
    # GPT-2's byte-to-unicode map
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {"<|endoftext|>": 0}
    for b, c in zip(bs, cs):
        vocab[chr(c)] = 1 + b
    return vocab


def tensors():
    t = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", [HIDDEN]),
              (p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
              (p + "self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
              (p + "self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
              (p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
              (p + "post_attention_layernorm.weight", [HIDDEN]),
              (p + "mlp.gate_proj.weight", [FFN, HIDDEN]),
              (p + "mlp.up_proj.weight", [FFN, HIDDEN]),
              (p + "mlp.down_proj.weight", [HIDDEN, FFN])]
    t += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if os.path.exists(a.out_dir) and (not os.path.isdir(a.out_dir) or os.listdir(a.out_dir)):
        sys.exit(f"tiny_model.py: {a.out_dir}: exists and is not an empty folder")
    os.makedirs(a.out_dir, exist_ok=True)
    rng = random.Random(a.seed)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in tensors():
        n = 1
        for d in shape:
            n *= d
        vals = array.array("f", [1.0] * n if len(shape) == 1 else [rng.gauss(0.0, 0.02) for _ in range(n)])
        if sys.byteorder != "little":
            vals.byteswap()
        data = vals.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
              "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": None,
              "eos_token_id": 0, "torch_dtype": "float32"}
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tok = {"version": "1.0", "model": {"type": "BPE", "vocab": byte_level_vocab(), "merges": []},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "decoder": {"type": "ByteLevel"}}
    with open(os.path.join(a.out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
