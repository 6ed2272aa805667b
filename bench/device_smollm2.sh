#!/usr/bin/env bash
# On the lent GPU machine: the default SmolLM2 job on the CUDA backend and its first-step
# loss against transformers on the same batch. The GGUF (93 MB) exceeds what one call may
# carry, so earlier calls left its first two pieces in /tmp/smolA and /tmp/smolB; this call
# carries the rest in .smolC/ (with the first 40 dataset lines) and .device/.
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
mkdir -p assets
cat /tmp/smolA /tmp/smolB .smolC/part > assets/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum assets/SmolLM2-135M-Instruct.Q4_1.gguf
cp .smolC/data.jsonl assets/kjv_instruct.jsonl
.device/bin/roundpipe train examples/specs/default.json --steps 3 --backend cuda --workers 1 \
  --dump-batch "$OUT/batch.json" --output-dir /tmp/run_gpu 2>&1 | grep -vE "^\[" 
.device/bin/roundpipe convert assets/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol_hf
PYTHONUNBUFFERED=1 python3 bench/hf_loss.py /tmp/smol_hf "$OUT/batch.json" 2>&1 | grep -E "HF_LOSS|Error"
