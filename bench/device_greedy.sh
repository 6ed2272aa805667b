#!/usr/bin/env bash
# On the lent GPU machine: transformers' greedy generations of the default model (CPU fp32 and
# CUDA bf16) for tests/fixtures/generate/smollm2_greedy.json, then Generate.* against them (our
# CUDA bf16 generator must give transformers' CUDA bf16 tokens). The GGUF (94 MB) exceeds what
# one call may carry: earlier calls left its pieces (split -b 37000000 -d) in /tmp/gg.00..02;
# this call has the programs in .device/ (bundle.sh).
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" assets
cat /tmp/gg.00 /tmp/gg.01 /tmp/gg.02 > assets/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum assets/SmolLM2-135M-Instruct.Q4_1.gguf
.device/bin/roundpipe convert assets/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-f32 --dtype f32 || exit 1
PYTHONUNBUFFERED=1 python3 scripts/make_generate_fixture.py /tmp/smollm2-f32 "$OUT/smollm2_greedy.json" || exit 1
cp "$OUT/smollm2_greedy.json" tests/fixtures/generate/smollm2_greedy.json
.device/bin/test_model --gtest_filter='Generate.*' 2>&1 | tail -25
