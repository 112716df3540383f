"""The Tune callbacks a stage runs with, in the sweep's own process: `TrackingCallback` mirrors every trial into
MLflow, `ProgressCallback` shows the stage's progress, `StorageWatch` stops the experiment when --storage fills up.
Part of the Ray backend (ray_backend.py says which module does what).

Tune pickles its callbacks into its experiment state by module and name: ray_backend still exposes each under its
old name, so an experiment saved before the backend was split resumes.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from raybench.paths import StorageFull, disk_full_errno_in, inside
from raybench.report_keys import BLIND_INFO, CLOCK_STAMPS, NODE, SELECTION_BEST, TIME_PREFIX
from raybench.sweep.progress import StageProgress
from raybench.sweep.progress import current as progress_display
from raybench.sweep.ray_collect import RunRecords, error_reason
from raybench.sweep.ray_trial import STOPPED_KEY
from raybench.sweep.ray_worker import EPOCHS_DONE, FAILURE_KEY, STAGES_KEY
from raybench.sweep.space import ResolvedSpace
from raybench.words import REPLICATE_STAGE

# Tune's "`process_trial_result` took 0.8 s, which may be a performance bottleneck" (the MLflow callback's
# sqlite commit on a busy 2-core machine): timing hints for Tune's developers, not the user's console.
logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)


# ----- MLflow: a Tune callback in the sweep's own process --------------------------------------------------
MAX_RUN_NAME = 120


def readable_run_name(stage: str, key: str, sampled: dict[str, Any], seed: int) -> str:
    """What the MLflow runs table shows: `search 04b9f357: lr=0.00196, penalty=1.31` or `replicate 04b9f357:
    seed 2871`. The full id stays in the run's tags (raybench.key, trial_id), which is what raybench looks up."""
    short = key.split("-seed")[0][:8]
    if stage == REPLICATE_STAGE:
        return f"replicate {short}: seed {seed}"
    values = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(sampled.items()))
    name = f"{stage} {short}: {values}" if values else f"{stage} {short}"
    return name if len(name) <= MAX_RUN_NAME else name[:MAX_RUN_NAME - 1] + "…"


TUNE_BOOKKEEPING = frozenset(AUTO_RESULT_KEYS)  # what Tune adds to every result: its counters, clock, pid, host


def science(result: dict[str, Any]) -> dict[str, Any]:
    """A result without Tune's bookkeeping and the trial's wall-clock stamps: what a run's MLflow metrics hold."""
    return {k: v for k, v in result.items() if k not in TUNE_BOOKKEEPING and k not in CLOCK_STAMPS}


class TrackingCallback(tune.Callback):
    """Mirrors every trial into a nested MLflow run through raybench.tracking (one log_batch per epoch).

    It lives in the process that runs the sweep, so workers never need to reach MLflow. It only hands its
    writes to the stage's TrialRunWriter, which writes them in order beside Tune's loop and journals them on
    --storage. Runs are named by a key (trial id, plus seed for replicates): a sweep that is not resuming
    creates its runs without asking the store for earlier ones; a resumed sweep, and a copy of this callback
    that Tune restores from its experiment state, finds them again and reuses them.
    """

    def __init__(self, tracker: Any, space: ResolvedSpace, stage: str, tags: dict[str, str],
                 records: RunRecords, journal: Path, resuming: bool) -> None:
        self.space, self.stage, self.tags, self.records = space, stage, tags, records
        self.uri, self.parent_id, self.journal, self.resuming = tracker.uri, tracker.parent_id, journal, resuming
        self.experiment = tracker.experiment_name
        self.__dict__.update(self._fresh_state())

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles callbacks into its experiment state and hands the copy back on restore: keep the
        tracking URI, parent run id and journal, and reconnect lazily."""
        return {**self.__dict__, **self._fresh_state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A restored copy resumes: it looks its runs up. A sweep started by an older raybench pickled fewer
        fields: the per-process ones start empty."""
        from raybench.tracking import EXPERIMENT  # a copy pickled before --experiment: the default experiment

        self.__dict__.update({"journal": None, "experiment": EXPERIMENT, **state, **self._fresh_state(), "resuming": True})

    @staticmethod
    def _fresh_state() -> dict[str, Any]:
        """What a restored copy rebuilds in its own process: the writer and the per-trial maps."""
        return {"_writer": None, "runs": {}, "stages_logged": set(), "nodes": {}}

    @property
    def writer(self) -> Any:
        if self._writer is None:
            from raybench.tracking import TRIAL_JOURNAL, TrialRunWriter

            journal = self.journal or self.records.completed.directory.parent / TRIAL_JOURNAL
            self._writer = TrialRunWriter.for_stage(self.uri, self.parent_id, journal, self.resuming, self.experiment)
        return self._writer

    def _submit(self, kind: str, key: str, **fields: Any) -> None:
        from raybench.tracking import RunWrite, WriteKind, now_ms

        self.writer.submit(RunWrite(WriteKind(kind), key, timestamp_ms=now_ms(), **fields))

    def _run(self, trial: Any) -> str:
        """The key of the trial's run, opened (handed to the writer) at the trial's first event."""
        if trial.trial_id not in self.runs:
            run = self.records.identity(trial)
            seed = run.config["seed"]
            tags = {**self.tags, "stage": self.stage, "trial_id": run.trial_id, "seed": str(seed),
                    "tune_trial_id": trial.trial_id}
            name = readable_run_name(self.stage, run.key,
                                     {k: v for k, v in trial.config.items() if k in self.space.search}, seed)
            self._submit("open", run.key, run_name=name, params=run.config, tags=tags)
            self.runs[trial.trial_id] = run.key
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """An epoch's metrics (the writer skips one its run already has); a failure's or a replayed record's
        result only moves the node tags."""
        key = self._run(trial)
        tags = self._node_tags(trial, result.get(NODE))
        if FAILURE_KEY not in result and not result.get("replayed"):
            from raybench.tracking import numeric_metrics

            self._submit("epoch", key, metrics=numeric_metrics(science(result)), step=int(result.get("epoch", iteration)),
                         tags=tags)
        elif tags:
            self._submit("tags", key, tags=tags)
        self._log_stages(trial, key, result)

    def _node_tags(self, trial: Any, node: str | None) -> dict[str, str]:
        """The run's `raybench.nodes` tag (the nodes it ran on, in order: `worker-1,head` after a node was lost)
        when this result moved it, sent with the epoch's metrics in the same request."""
        seen = self.nodes.setdefault(trial.trial_id, [])
        if not node or (seen and seen[-1] == node):
            return {}
        seen.append(node)
        return {"raybench.nodes": ",".join(seen)}

    def _log_stages(self, trial: Any, key: str, result: dict) -> None:
        """Each earlier stage of a multi-stage method becomes a run nested in the trial's run, once."""
        for stage in json.loads(result.get(STAGES_KEY) or "[]"):
            if (trial.trial_id, stage["name"]) not in self.stages_logged:
                self._submit("stage", key, stage=stage)
                self.stages_logged.add((trial.trial_id, stage["name"]))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        key = self._run(trial)
        last, record = trial.last_result or {}, self.records.for_trial(trial)
        reason = last.get(FAILURE_KEY)  # a diverged Train run ends without an exception
        tags = {"raybench.selection_blind": str(last[BLIND_INFO])} if last.get(BLIND_INFO) else {}
        if record.get(STOPPED_KEY):
            tags["raybench.stopped_early"] = f"after epoch {int(record[EPOCHS_DONE]) - 1}"
        from raybench.tracking import RUN_FAILED, RUN_FINISHED, numeric_metrics

        timing = {}
        if record and not last.get("replayed"):  # what the run used, from its record

            timing = numeric_metrics(science({k: v for k, v in record.items() if k.startswith(TIME_PREFIX)}))
        self._submit("end", key, metrics=timing, step=int(record.get("epoch", iteration)) if timing else 0, tags=tags,
                     status=RUN_FAILED if reason else RUN_FINISHED, reason=reason)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from raybench.tracking import RUN_FAILED

        self._submit("end", self._run(trial), status=RUN_FAILED, reason=error_reason(trial))


class ProgressCallback(tune.Callback):
    """A stage's progress (raybench/sweep/progress.py), shown by the process's display as Tune's loop runs:
    `0/N` when the stage begins, each trial as it starts and reports epochs, a line per finished trial.
    Tune pickles callbacks into its experiment state: a restored copy keeps its counts, restarts its clock and
    shows on the display of the process that restored it."""

    def __init__(self, progress: StageProgress, records: RunRecords) -> None:
        self.progress, self.records = progress, records

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.progress.restart()

    def setup(self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any) -> None:
        progress_display().stage_began(self.progress)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run = self.records.identity(trial)
        label = f"seed {run.config['seed']}" if self.records.stage == REPLICATE_STAGE else f"trial {run.trial_id}"
        epochs = run.config.get("epochs")
        self.progress.trial_started(trial.trial_id, label, int(epochs) if isinstance(epochs, (int, float)) else None)
        progress_display().moved(self.progress)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if FAILURE_KEY in result or result.get("replayed"):
            return
        self.progress.epoch_reported(trial.trial_id, int(result.get(EPOCHS_DONE, 0)), result.get(SELECTION_BEST))
        progress_display().moved(self.progress)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        progress_display().tick(self.progress)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        line = self.progress.finished(last.get(SELECTION_BEST), failed=FAILURE_KEY in last,
                                      replayed=bool(last.get("replayed")),
                                      stopped=bool(self.records.for_trial(trial).get(STOPPED_KEY)), key=trial.trial_id)
        progress_display().trial_finished(self.progress, line)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        progress_display().trial_finished(self.progress, self.progress.finished(None, failed=True, key=trial.trial_id))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        progress_display().stage_ended(self.progress)


# ----- a full --storage: stop as on Ctrl-C, so that --resume continues exactly ------------------------------
FULL_STORAGE: dict[str, StorageFull] = {}  # per --storage folder: what filled it, for _fit_or_resume to raise


class StorageWatch(tune.Callback):
    """Stops the experiment when a trial failed because a folder filled up (ENOSPC) or a quota ran out
    (EDQUOT): every later checkpoint would fail the same way, and a trial that used up its retries on it would
    stay failed for good. Tune is stopped as on Ctrl-C, so a trial that was about to be retried stays unfinished
    in Tune's saved state and `--resume` continues it from its last checkpoint once space is freed;
    `_fit_or_resume` then raises the StorageFull recorded here. A trial with no retry left (`--max-failures 0`,
    or a Train-executor trial, which Ray Train retried already) has been marked failed by Tune before this sees it."""

    def __init__(self, storage: Path) -> None:
        self.storage = Path(storage)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check(trial)

    def _check(self, trial: Any) -> None:
        text = _error_text(trial)
        code = disk_full_errno_in(text)
        if code is None or str(self.storage) in FULL_STORAGE:
            return
        FULL_STORAGE[str(self.storage)] = _storage_full(self.storage, trial, text, code)
        _stop_tune()


def _storage_full(storage: Path, trial: Any, text: str, code: int) -> StorageFull:
    """What filled up, in words: --storage (Ray's uploads name no file; raybench's own records name one inside
    it) unless the error names a file elsewhere, such as the local temporary folder a checkpoint is staged in."""
    named = re.search(r"\[Errno \d+\][^'\n]*'(/[^'\n]+)'", text)
    if named and not inside(storage, Path(named.group(1))):
        return StorageFull(Path(named.group(1)).parent, f"trial {trial.trial_id}'s files", code, flag="")
    folder = getattr(trial, "path", None)
    where = f" ({os.path.relpath(folder, storage)})" if folder and inside(storage, Path(folder)) else ""
    return StorageFull(storage, f"a checkpoint or record of trial {trial.trial_id}{where}", code)


def _error_text(trial: Any) -> str:
    path = trial.error_file
    return Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""


def _stop_tune() -> None:
    """End the running Tune loop as Ctrl-C would, through the SIGUSR1 handler Tune installs while it runs in
    the main thread: unfinished trials keep their saved state and checkpoints. Without that handler (Tune run
    from another thread) the loop goes on, and the StorageFull is raised when it ends. Tune's handler runs within
    raise_signal; its "Stop signal received (e.g. via SIGINT/Ctrl+C)" would blame a Ctrl-C nobody pressed."""
    if threading.current_thread() is not threading.main_thread() or not callable(signal.getsignal(signal.SIGUSR1)):
        return
    tune_log = logging.getLogger("ray.tune.tune")
    level = tune_log.level
    tune_log.setLevel(logging.ERROR)
    try:
        signal.raise_signal(signal.SIGUSR1)
    finally:
        tune_log.setLevel(level)
