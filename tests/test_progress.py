"""What a sweep prints while it runs, and what it says it used: progress lines and compute totals."""
from __future__ import annotations

import pickle

import pytest

from raybench.records import TrialRecord, TrialStatus
from raybench.sweep.progress import StageProgress, duration
from raybench.sweep.results import compute_line, compute_totals


def run(metrics: dict[str, float], status: TrialStatus = TrialStatus.OK) -> TrialRecord:
    return TrialRecord(0, "t", 0, {}, status, metrics=metrics)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0, 42.4, 60, 187, 3599, 3720)] == ["0s", "42s", "1m00s", "3m07s", "59m59s", "1h02m"]


def test_one_line_per_finished_trial_with_counts_best_elapsed_and_eta():
    clock = FakeClock()
    progress = StageProgress("search", 4, "val/acc", clock=clock)
    clock.now += 60
    assert progress.finished(0.5, failed=False) == \
        "search: 1/4 done, 0 failed, best val/acc 0.5000, elapsed 1m00s, ETA 3m00s"
    clock.now += 60
    assert progress.finished(None, failed=True) == \
        "search: 2/4 done, 1 failed, best val/acc 0.5000, elapsed 2m00s, ETA 2m00s"
    clock.now += 30
    line = progress.finished(0.75, failed=False)
    assert line.startswith("search: 3/4 done, 1 failed, best val/acc 0.7500") and line.endswith("ETA 50s")
    assert progress.finished(0.9, failed=True).endswith("best val/acc 0.7500, elapsed 2m30s, ETA 0s")  # a failed
    # trial's value is never the best


def test_replayed_trials_and_a_resume_leave_the_rate_alone():
    clock = FakeClock()
    progress = StageProgress("replicates", 3, "val/acc", clock=clock)
    assert progress.finished(0.4, failed=False, replayed=True).endswith("ETA unknown")
    clock.now += 100
    assert progress.finished(0.3, failed=False).endswith("elapsed 1m40s, ETA 1m40s")
    restored = pickle.loads(pickle.dumps(progress))  # Tune hands a pickled copy back on resume
    restored.clock = clock
    restored.restart()
    assert (restored.done, restored.best) == (2, 0.4) and restored.line().endswith("elapsed 0s, ETA unknown")


def test_compute_totals_sum_every_run_failed_ones_included():
    runs = [run({"time/wall_s": 10.0, "time/cpu_s": 7.5, "time/gpu_s": 2.5}),
            run({"time/cpu_s": 1.5}, TrialStatus.FAILED),  # died before its driver could time it
            run({"time/wall_s": 4.0, "time/cpu_s": 3.0, "time/gpu_s": float("nan")})]
    totals = compute_totals(runs)
    assert totals == {"runs": 3.0, "wall_s": 14.0, "cpu_s": 12.0, "gpu_s": 2.5}
    line = compute_line({"search": totals, "replicates": compute_totals([])})
    assert line == "Compute: search 3 runs, 14 trial-s wall, 12 CPU-s, 2 GPU-s"
    both = compute_line({"replicates": totals, "search": totals})  # summary.json sorts its keys
    assert both.startswith("Compute: search 3 runs") and both.endswith("; replicates 3 runs, 14 trial-s wall, "
                                                                        "12 CPU-s, 2 GPU-s")
    hours = compute_line({"search": {"runs": 1.0, "wall_s": 7200.0, "cpu_s": 5400.0, "gpu_s": 0.0}})
    assert hours == "Compute: search 1 runs, 2.00 trial-h wall, 1.50 CPU-h, 0 GPU-s"
    assert compute_line({"search": compute_totals([])}) == "Compute: nothing ran"


@pytest.mark.parametrize("missing", ["time/wall_s", "time/cpu_s"])
def test_a_run_without_a_field_adds_nothing(missing):
    runs = [run({"time/wall_s": 1.0, "time/cpu_s": 1.0}), run({"time/wall_s": 2.0, "time/cpu_s": 2.0})]
    del runs[1].metrics[missing]
    assert compute_totals(runs)[missing.split("/")[1]] == 1.0


def test_a_data_parallel_trials_cpu_seconds_count_every_worker():
    from raybench.report_keys import CPU_S as CPU_KEY
    from raybench.sweep.ray_worker import with_workers_cpu

    ranks = [{CPU_KEY: 3.0, "val/acc": 0.5}, {CPU_KEY: 2.5, "val/acc": 0.4}, {CPU_KEY: 1.5}]
    merged = with_workers_cpu(ranks)
    assert merged[0] == {CPU_KEY: 7.0, "val/acc": 0.5} and merged[1:] == ranks[1:]  # rank 0's metrics otherwise
    assert ranks[0][CPU_KEY] == 3.0  # the workers' own reports are left as they were
    assert with_workers_cpu(ranks[:1]) == ranks[:1]
