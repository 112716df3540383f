"""`collect` turns a stage's Tune results into typed records, and the runner tells an interrupted stage from a
finished one. A signal can stop Tune's loop in the moment between a run writing its completed record and its
reports reaching Tune: that run is read whole from its record, and the stage still counts as interrupted. And a
signal can come as Tune starts a trial's actor: Tune's clean-up then ends that trial as terminated or errored,
with no report and no record, so the stage is known to be interrupted from the signal, not from its trials."""
from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

from ray.tune.tune import _setup_signal_catching

from raybench.records import TrialStatus
from raybench.report_keys import SELECTION_BEST
from raybench.sweep.ray_backend import (
    CompletedRuns,
    Resources,
    RunSpec,
    StageResult,
    _fit_or_resume,
    collect,
    cut_short,
)
from raybench.sweep.space import ResolvedSpace, run_key

SPACE = ResolvedSpace(algorithm="erm", dataset="tiny", search={}, fixed={"lr": 0.01}, derived={},
                      default_epochs=2, lr_center=0.01)
SEEDS = (11, 12)


@dataclasses.dataclass
class FakeResult:
    """The fields of a Tune `Result` that collect reads."""

    config: dict[str, Any]
    metrics: dict[str, Any]
    path: str = ""
    error: Exception | None = None
    checkpoint: Any = None


class FakeGrid(list):
    """A Tune `ResultGrid`: its results, and how many trials Tune itself saw end."""

    def __init__(self, results: list[FakeResult], ended: int) -> None:
        super().__init__(results)
        self.num_terminated, self.num_errors = ended, 0


def _spec(tmp_path: Path) -> RunSpec:
    return RunSpec("s-replicate-x", tmp_path, "replicate", "function", Resources(1, 1.0, 0.0, 0), 1)


def _last_report(value: float) -> dict[str, Any]:
    return {SELECTION_BEST: value, "best/val/acc": value, "best_epoch": 1, "time/trial_s": 3.0}


def _record(tmp_path: Path, seed: int, value: float) -> None:
    key = run_key(SPACE.materialize({"seed": seed}), "replicate")
    CompletedRuns(tmp_path / "s-replicate-x" / "completed").save(key, _last_report(value))


def test_a_run_whose_reports_never_reached_tune_is_read_whole_from_its_completed_record(tmp_path):
    """Tune stopped (a SIGTERM) as the second replicate finished: Tune holds none of its reports, its record
    holds them all. It is `ok` with its selection value, not failed with 'no epoch finished'."""
    for seed, value in zip(SEEDS, (0.5, 0.7)):
        _record(tmp_path, seed, value)
    grid = FakeGrid([FakeResult({"seed": SEEDS[0]}, _last_report(0.5)), FakeResult({"seed": SEEDS[1]}, {})], ended=1)
    records = collect(grid, SPACE, _spec(tmp_path))
    assert [r.status for r in records] == [TrialStatus.OK, TrialStatus.OK], [r.failure_reason for r in records]
    assert [r.selection_value for r in records] == [0.5, 0.7]
    assert records[1].metrics["best/val/acc"] == 0.7


def test_a_run_without_a_record_is_interrupted_and_a_stage_tune_cut_short_says_so(tmp_path):
    _record(tmp_path, SEEDS[0], 0.5)
    grid = FakeGrid([FakeResult({"seed": SEEDS[0]}, _last_report(0.5)), FakeResult({"seed": SEEDS[1]}, {})], ended=1)
    records = collect(grid, SPACE, _spec(tmp_path))
    assert [r.status for r in records] == [TrialStatus.OK, TrialStatus.INTERRUPTED]
    assert cut_short(StageResult(grid, signalled=False))
    assert not cut_short(StageResult(FakeGrid(list(grid), ended=2), signalled=False))


def test_a_run_tune_saw_fail_keeps_tunes_reason_over_its_record(tmp_path):
    _record(tmp_path, SEEDS[0], 0.5)
    failed = FakeResult({"seed": SEEDS[0]}, {}, error=RuntimeError("worker died\nOSError: disk gone"))
    (record,) = collect(FakeGrid([failed], ended=0), SPACE, _spec(tmp_path))
    assert record.status == TrialStatus.FAILED and record.failure_reason == "OSError: disk gone"



class FakeTuner:
    """A Tuner whose fit does what Tune's does with signals (its own `_setup_signal_catching`), then ends with
    every trial terminated, as Tune's clean-up leaves a trial whose actor it had just started."""

    def __init__(self, grid: FakeGrid, signal_during_fit: bool) -> None:
        self.grid, self.signal_during_fit = grid, signal_during_fit

    def fit(self) -> FakeGrid:
        stopped = _setup_signal_catching()
        if self.signal_during_fit:
            signal.raise_signal(signal.SIGINT)  # Tune's handler runs: it sets the event and restores the caller's
            assert stopped.is_set()
        return self.grid


def test_a_stage_a_signal_stopped_is_cut_short_though_tune_ended_every_trial(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNE_DISABLE_SIGINT_HANDLER", raising=False)
    grid = FakeGrid([FakeResult({"seed": SEEDS[0]}, _last_report(0.5)), FakeResult({"seed": SEEDS[1]}, {})], ended=2)
    caller = signal.getsignal(signal.SIGINT)
    for signalled in (True, False):
        stage = _fit_or_resume(_spec(tmp_path), None, lambda signalled=signalled: FakeTuner(grid, signalled), resume=False)
        assert (stage.signalled, cut_short(stage)) == (signalled, signalled)
        assert signal.getsignal(signal.SIGINT) is caller  # the caller's handler is back either way
