#!/usr/bin/env bash
# Issue #5's GPU check: raybench's trainer vs a bare PyTorch loop, bf16, on the camelyon17 (DenseNet-121) and
# civilcomments (MiniLM) fixtures; 300 steps each, well under 5 minutes on one modern GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec timeout 300 "$PY" benchmarks/gpu_check.py --device cuda --steps "${STEPS:-300}" --batch-size "${BATCH:-32}"
