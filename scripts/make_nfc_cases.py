#!/usr/bin/env python3
"""Regenerates tests/fixtures/qwen3-tokenizer/nfc_cases.json: 1,500 random strings rich in
decomposed accents (base letter + combining marks, Hangul jamo, Greek and Vietnamese
diacritics, next to ASCII, digits and punctuation) and the token ids Hugging Face
`tokenizers` (pip install tokenizers) gives for them with the Qwen3 tokenizer fixture, whose
normalizer is NFC. Deterministic (seeded)."""
import json
import os
import random
import unicodedata

from tokenizers import Tokenizer, __version__

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "qwen3-tokenizer")
tok = Tokenizer.from_file(os.path.join(here, "tokenizer.json"))
rng = random.Random(20240611)

ascii_words = ["the", "cafe", "resume", "naive", "Zoe", "uber", "año", "42", "3.14", "hello", "--", "!", "(x)", "a"]
bases = "aeiouyAEIOUYcnszgCNSZGwW"
combining = [chr(c) for c in range(0x300, 0x370)] + ["\u0323", "\u0328", "\u0331", "\u1dc0", "\u20d7"]
precomposed = "éèêëàâäîïôöûüçñÉÈÅØÆœßỳẽ"
greek = "αεηιουωΑΕΗΙΟΥΩ"
hangul_l = [chr(c) for c in range(0x1100, 0x1113)]
hangul_v = [chr(c) for c in range(0x1161, 0x1176)]
hangul_t = [chr(c) for c in range(0x11A8, 0x11C3)]
cjk = "中文字漢語日本"


def piece():
    r = rng.random()
    if r < 0.30:  # a decomposed letter: base + 1..3 combining marks, any order
        return rng.choice(bases + greek) + "".join(rng.choice(combining) for _ in range(rng.randint(1, 3)))
    if r < 0.40:  # an NFD form of a precomposed letter
        return unicodedata.normalize("NFD", rng.choice(precomposed))
    if r < 0.48:  # Hangul from conjoining jamo (L V [T])
        return rng.choice(hangul_l) + rng.choice(hangul_v) + (rng.choice(hangul_t) if rng.random() < 0.5 else "")
    if r < 0.55:
        return rng.choice(precomposed)
    if r < 0.60:
        return rng.choice(cjk)
    if r < 0.85:
        return rng.choice(ascii_words)
    return rng.choice([" ", " ", "  ", "\n", "\t", ".", ",", "'s", "0", "7"])


cases = []
for _ in range(1500):
    s = "".join(piece() for _ in range(rng.randint(1, 12)))
    cases.append({"text": s, "ids": tok.encode(s, add_special_tokens=False).ids})
changed = sum(unicodedata.normalize("NFC", c["text"]) != c["text"] for c in cases)
with open(os.path.join(here, "nfc_cases.json"), "w", encoding="utf-8") as f:
    json.dump({"tokenizers_version": __version__, "not_nfc": changed, "cases": cases}, f, ensure_ascii=True)
    f.write("\n")
print(f"wrote {len(cases)} cases ({changed} not in NFC) with tokenizers {__version__}")
