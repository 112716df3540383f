#!/usr/bin/env bash
# The GPU check: raybench's Trainer, eager and compiled, beside a bare eager and a bare compiled loop, bf16, on the
# camelyon17 (DenseNet-121, 96 px, batch 32), iwildcam (ResNet-50, 448 px JPEG, batch 16) and civilcomments
# (MiniLM, batch 32) fixtures; TFLOP/s against the GPU's own bf16 matmul rate; the goals' PASS/MISS. The script
# keeps within --budget (450 s) and names what did not fit; `timeout 480` is the hard stop on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec timeout 480 "$PY" benchmarks/gpu_check.py --device cuda --steps "${STEPS:-200}" --warm-up "${WARM_UP:-10}" \
    --repeats "${REPEATS:-1}" --batch-size "${BATCH:-32}" --budget "${BUDGET:-450}" "$@"
