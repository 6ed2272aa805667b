#!/usr/bin/env bash
# Runs the examples built against the installed package (build_examples.sh) on a tiny model:
# tests/fixtures/hf_golden/tiny_llama (vocab 256) with a byte-level tokenizer written here
# (token id = byte value, eos "<|endoftext|>" = id 2 as in its config), trained on a text
# excerpt of tests/fixtures/sotu-excerpt.
#   tests/package/run_examples.sh session|trainer SOURCE_DIR WORK_DIR
set -euo pipefail
which=$1 src=$2 work=$3
bin=$work/examples
run=$work/run-$which
rm -rf "$run"
mkdir -p "$run/model"
cp "$src/tests/fixtures/hf_golden/tiny_llama/config.json" "$src/tests/fixtures/hf_golden/tiny_llama/model.safetensors" \
   "$run/model/"
python3 - "$run/model/tokenizer.json" <<'PY'
import json, sys
# GPT-2's byte-to-unicode map: the symbols byte-level BPE uses for raw bytes
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs) if b != 2}
vocab["<|endoftext|>"] = 2
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "added_tokens": [{"id": 2, "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "decoder": {"type": "ByteLevel"}}, open(sys.argv[1], "w"))
PY
data=$src/tests/fixtures/sotu-excerpt/1790_george_washington.txt

case $which in
session)
  # 4 steps in one go, and 2 + 2 with a resume in between: the same weights and losses
  "$bin/embed_train" "$run/model" "$data" "$run/a" 4 | tee "$run/a.txt"
  "$bin/embed_train" "$run/model" "$data" "$run/b" 2 | tee "$run/b.txt"
  "$bin/embed_train" "$run/model" "$data" "$run/c" 4 "$run/b" | tee "$run/c.txt"
  [ "$(grep '^step 4 ' "$run/a.txt")" = "$(grep '^step 4 ' "$run/c.txt")" ] ||
    { echo "the resumed run's step 4 differs from the uninterrupted one"; exit 1; }
  cmp "$run/a/model.safetensors" "$run/c/model.safetensors"
  cmp "$run/a/optimizer.bin" "$run/c/optimizer.bin"
  ;;
trainer)
  "$bin/trainer_example" "$run/model" "$data" "$run/out" 6 | tee "$run/out.txt"
  grep -q "^stopped after" "$run/out.txt"
  grep -q "^eval after step 2" "$run/out.txt"
  grep -q "^step 6/6 " "$run/out.txt"
  [ -s "$run/out/final/model.safetensors" ]
  for f in optimizer_state.bin roundpipe_state.json; do [ -s "$run/out/state/final/$f" ]; done
  ;;
*) echo "usage: $0 session|trainer SOURCE_DIR WORK_DIR"; exit 2 ;;
esac
echo "[package] $which example: ok"
