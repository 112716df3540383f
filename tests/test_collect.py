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
from raybench.sweep.ray_collect import collect
from raybench.sweep.ray_search import RunSpec, StageResult, _fit_or_resume, cut_short
from raybench.sweep.ray_trial import CompletedRuns, Resources
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


# ----- one source: the trial's completed record; Tune's last result only where a trial left none -----------------
@dataclasses.dataclass
class FakeCheckpoint:
    path: str


def _key(seed: int) -> str:
    return run_key(SPACE.materialize({"seed": seed}), "replicate")


def test_a_finished_trials_fields_come_from_its_record_alone_whatever_tune_last_received(tmp_path):
    """Tune's copy of the last report is not the record: a Train run's record sums every worker's CPU-seconds and
    names where its checkpoint was persisted. No field of the record is taken from Tune's copy."""
    recorded = {**_last_report(0.7), "time/cpu_s": 8.0, "info/node": "worker-1", "epochs_done": 2,
                "checkpoint_path": "/runs/train/run-a/checkpoint_000001", "time/wall_s": 9.0}
    CompletedRuns(tmp_path / "s-replicate-x" / "completed").save(_key(SEEDS[0]), recorded)
    tune_saw = {**_last_report(0.5), "time/cpu_s": 3.0, "info/node": "head", "epochs_done": 1, "trial_id": "abc12_00003",
                "checkpoint_path": "/runs/train/run-a/checkpoint_000000", "best/val/stale": 0.1}
    result = FakeResult({"seed": SEEDS[0]}, tune_saw, path="/runs/s/train_driver_abc12_00003_3_seed=11",
                        checkpoint=FakeCheckpoint("/tune/checkpoint_000000"))
    (record,) = collect(FakeGrid([result], ended=1), SPACE, _spec(tmp_path))
    assert record.status == TrialStatus.OK and record.selection_value == 0.7
    assert record.metrics == {"best/val/acc": 0.7, "time/trial_s": 3.0, "time/cpu_s": 8.0, "time/wall_s": 9.0}
    assert (record.node, record.epochs_run, record.checkpoint) == ("worker-1", 2, recorded["checkpoint_path"])
    assert record.order == 3  # Tune's creation index, which only Tune knows: from its trial id and folder


def test_a_trial_that_left_no_record_is_read_from_tunes_last_result(tmp_path):
    """By design two trials leave no record: a Train-executor run that diverged (its driver raises with the reason
    its last report carried) and a trial a signal interrupted (its epochs so far, never selected)."""
    diverged = FakeResult({"seed": SEEDS[0]}, {"failure_reason": "diverged: loss is nan", "selection/best": float("nan"),
                                                "info/node": "head"},
                          error=RuntimeError("TrialFailed: diverged: loss is nan"))
    interrupted = FakeResult({"seed": SEEDS[1]}, {**_last_report(0.6), "epochs_done": 2, "info/node": "worker-1"},
                             checkpoint=FakeCheckpoint("/tune/function_trial_x/checkpoint_000001"))
    failed, stopped = collect(FakeGrid([diverged, interrupted], ended=1), SPACE, _spec(tmp_path))
    assert (failed.status, failed.failure_reason, failed.node) == (TrialStatus.FAILED, "diverged: loss is nan", "head")
    assert (stopped.status, stopped.selection_value, stopped.epochs_run) == (TrialStatus.INTERRUPTED, None, 2)
    assert stopped.metrics["best/val/acc"] == 0.6 and stopped.node == "worker-1"
    assert stopped.checkpoint == "/tune/function_trial_x/checkpoint_000001"  # a function trial's: where Tune put it


def test_a_record_that_names_no_checkpoint_takes_tunes(tmp_path):
    """A function trial's record from a raybench that did not yet record the path (a sweep resumed across
    versions): the checkpoint Tune persisted for the trial stands in."""
    _record(tmp_path, SEEDS[0], 0.5)
    result = FakeResult({"seed": SEEDS[0]}, {}, checkpoint=FakeCheckpoint("/tune/function_trial_y/checkpoint_000001"))
    (record,) = collect(FakeGrid([result], ended=1), SPACE, _spec(tmp_path))
    assert record.status == TrialStatus.OK and record.checkpoint == "/tune/function_trial_y/checkpoint_000001"
