"""A sweep nested under a parent run (`--parent-run`): the parent must be a run of the store's raybench
experiment, and a benchmark's parent hands its sweeps the benchmark's resume command."""
from __future__ import annotations

import pytest

from raybench.tracking import RESUME_TAG, BenchmarkTracker, SweepTracker, TrackingError

BENCHMARK_RESUME = "raybench benchmark grid.yaml --storage runs --resume"


def test_a_benchmarks_sweep_is_resumed_by_resuming_the_benchmark(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = BenchmarkTracker(uri).start_benchmark("grid", {}, BENCHMARK_RESUME)
    assert SweepTracker(uri).check_parent_run(parent) == BENCHMARK_RESUME


def test_a_parent_that_is_no_benchmark_gives_no_resume_command(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = SweepTracker(uri)
    parent = sweep.start_sweep("outer", {}, {RESUME_TAG: "raybench sweep erm --name outer --resume"})
    assert SweepTracker(uri).check_parent_run(parent) is None


def test_a_parent_run_missing_from_the_store_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(TrackingError, match="expected a run id in the MLflow store"):
        SweepTracker(uri).check_parent_run("0123456789abcdef0123456789abcdef")
