#!/usr/bin/env python3
"""Tables of bench/device_fp16_accumulation.sh's runs: 20-step window means of the training loss
and every evaluation, fp16 accumulation against fp32 accumulation (both with f16 compute), the
bf16 reference beside them. Usage: bench/fp16_accumulation_table.py DIR (holding
metrics_<dtype>_<acc>.csv)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loss_curve_table  # noqa: E402

if len(sys.argv) != 2:
    sys.exit(__doc__)
loss_curve_table.main([sys.argv[0], sys.argv[1], "f16_f32", "f16_f16", "bf16_f32"])
