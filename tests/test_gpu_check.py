"""benchmarks/gpu_check.py's dry run on a CPU: the script a GPU session runs as it is must not first fail there.

Tiny steps and images, compiled columns left out (compiling DenseNet-121, ResNet-50 and MiniLM on a CPU takes
minutes); what is checked is that every column, the FLOP count, the goals' verdicts and the budget's account of
what it skipped all print."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRY_RUN = ["--device", "cpu", "--steps", "1", "--warm-up", "1", "--input-size", "32", "--iwildcam-size", "32",
           "--batch-size", "4", "--iwildcam-batch-size", "2", "--matmul-size", "64", "--no-compile"]
WORKLOADS = ("camelyon17 DenseNet-121", "iwildcam ResNet-50 JPEG", "civilcomments MiniLM")


def dry_run(*extra: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), *DRY_RUN, *extra], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def lines_with(output: str, *words: str) -> list[str]:
    return [line for line in output.splitlines() if all(word in line for word in words)]


def test_the_dry_run_prints_every_eager_column_its_flops_and_the_goals_verdicts():
    output = dry_run()
    for workload in WORKLOADS:
        assert lines_with(output, workload, "GFLOP a step")
        for column in ("raybench eager ", "bare eager "):
            assert lines_with(output, workload, column, "TFLOP/s", "% of matmul", "warm-up"), (workload, column)
        assert lines_with(output, workload, "raybench eager / bare eager", "(goal >= 0.97)"), workload
    for workload in WORKLOADS[:2]:
        assert lines_with(output, workload, "bare eager channels-last", "TFLOP/s")
        assert lines_with(output, workload, "raybench compiled / bare eager", "not measured")
    assert lines_with(output, "physical-limit reference", "matmul", "TFLOP/s")
    assert lines_with(output, "skipped: every compiled column")


def test_a_column_the_budget_cannot_fit_is_named_never_skipped_silently():
    output = dry_run("--budget", "0")
    for workload in WORKLOADS:
        assert lines_with(output, "skipped:", workload, "raybench eager"), workload
        assert lines_with(output, "skipped:", workload, "bare eager"), workload
        assert lines_with(output, workload, "raybench eager / bare eager", "not measured")
    assert not lines_with(output, "TFLOP/s   ")
