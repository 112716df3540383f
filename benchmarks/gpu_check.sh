#!/usr/bin/env bash
# Issues #5 and #14's GPU check: raybench's trainer (reading the fixtures' files ahead of each step) vs a bare
# PyTorch loop on a pre-loaded batch, bf16: camelyon17 (DenseNet-121, 96 px), iwildcam (ResNet-50, 448 px JPEG)
# and civilcomments (MiniLM); 300 steps each, under 8 minutes on one modern GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec timeout 480 "$PY" benchmarks/gpu_check.py --device cuda --steps "${STEPS:-300}" --batch-size "${BATCH:-32}"
