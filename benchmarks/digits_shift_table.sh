#!/usr/bin/env bash
# The embedded Table 2 at the protocol's budget: every WILDS algorithm raybench has, as a sweep on digits-shift
# with OOD-validation selection, 10 random configs + 3 seed replicates each, all at the WILDS budget rule with every
# epoch over half the labeled data, under the convergence rule (raybench/grids/table2_digits.yaml says why and how),
# on one private local Ray; then `raybench compare` over them, with each method's budget and checks.
#
#   benchmarks/digits_shift_table.sh [OUT]      (OUT default: bench-digits; resumes a benchmark already there)
set -euo pipefail
OUT=${1:-bench-digits}
RAYBENCH=${RAYBENCH:-.venv/bin/raybench}
mkdir -p "$OUT"
URI="sqlite:///$(cd "$OUT" && pwd)/mlflow.db"
resume=(); [ -d "$OUT/runs/table2" ] && resume=(--resume)
"$RAYBENCH" benchmark table2_digits --storage "$OUT/runs" --tracking-uri "$URI" "${resume[@]}"
# The table and its figure, as published in the README ("The embedded Table 2 under the convergence rule").
"$RAYBENCH" compare --dataset digits-shift --tracking-uri "$URI" --format markdown --plot "$OUT/digits_shift_table.png"
