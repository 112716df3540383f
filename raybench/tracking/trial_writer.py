"""A sweep stage's trial runs, written to MLflow beside the sweep instead of in its way: Tune's callback hands
each write (RunWrite) to the stage's TrialRunWriter, which journals it on --storage (TRIAL_JOURNAL) and sends it
from one background thread."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from raybench.paths import StorageFull
from raybench.tracking import client as tracking_client
from raybench.tracking.names import EXPERIMENT, RUN_RUNNING
from raybench.tracking.runs import RunWriter
from raybench.tracking.store import TrackingError, redact_uri

TRIAL_JOURNAL = "tracking-journal.jsonl"  # in a stage's Tune experiment folder under --storage


class WriteKind(str, Enum):
    OPEN = "open"  # the trial's run: created, or found again when resuming
    EPOCH = "epoch"  # one epoch's metrics (and node tags), at the epoch's step
    TAGS = "tags"
    STAGE = "stage"  # an earlier stage of a multi-stage method, as a run nested in the trial's
    END = "end"  # the run's closing metrics (what it used), its status and failure reason


@dataclass(frozen=True)
class RunWrite:
    """One write to a trial's run, which it names by the run's key: what the sweep's Tune callback hands the
    writer, and one line of the stage's journal. Metrics carry the time they were reported, so writing them
    again changes nothing: MLflow's SQL store keeps a metric row (key, time, step, value) once."""

    kind: WriteKind
    key: str
    run_name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    timestamp_ms: int = 0
    status: str = ""
    reason: str | None = None
    stage: dict[str, Any] | None = None

    def line(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "kind": self.kind.value}, default=str)

    @classmethod
    def from_line(cls, line: str) -> RunWrite:
        values = json.loads(line)
        return cls(**{**values, "kind": WriteKind(values["kind"])})


def read_journal(path: Path) -> list[RunWrite]:
    """The writes a stage's earlier drivers handed over; a last line cut short by a kill is dropped (its write
    was never handed over: the journal is appended before the queue)."""
    if not path.is_file():
        return []
    writes = []
    for line in path.read_text().splitlines():
        try:
            writes.append(RunWrite.from_line(line))
        except (ValueError, TypeError, KeyError):
            continue
    return writes


class TrialRunWriter:
    """The trial runs of one sweep stage, written to MLflow in order by one background thread, so that Tune's
    callback only hands writes over and the driver never waits on the store between trials (over HTTP each
    call costs tens of milliseconds, and Tune's loop, which schedules the next trial, runs the callback).

    Nothing is lost: each write is appended to the stage's journal (TRIAL_JOURNAL, on --storage) before it is
    queued. The writer is drained at every stage's end (Tune returns from a Ctrl-C too) and before the sweep's
    parent run is closed (a SIGTERM or an error), and a resumed sweep writes its journal again first: a driver
    killed outright (SIGKILL) leaves writes the store never got, and writing again those it did get changes
    nothing (runs are found by key, metrics keep their time, tags and statuses are set to the same values). A
    write that fails for good stops the writer: the sweep ends with that error, and `--resume` writes the rest.
    A tracking server that is down is no such failure: the writer's client waits for it (OUTAGE_S, CountedClient)
    and the sweep goes on meanwhile, so a server stopped for a minute in a stage costs nothing; the writer only
    asks the store for anything in its own thread, never when Tune's callback makes it at a stage's start.
    One writer per stage journal in a process: a copy of Tune's callback restored from its experiment state
    finds the same one."""

    _open: ClassVar[dict[Path, TrialRunWriter]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, uri: str, parent_id: str, journal: Path, resuming: bool, experiment: str = EXPERIMENT) -> None:
        self.tracker = RunWriter(uri, experiment, background=True)  # the parent's experiment: MLflow nests only within one
        self.tracker.parent_id = parent_id
        self.journal, self.resuming = journal, resuming
        self.runs: dict[str, str] = {}  # run key -> run id; below, the writer thread's own bookkeeping
        self.logged_through: dict[str, int] = {}  # per key, the last epoch in the store
        self.ended: set[str] = set()
        self.live: set[str] = set()  # opened by this driver's trials, not only named by the journal
        self.stages: set[str] = set()
        self.error: Exception | None = None
        self.error_raised = False
        self.queue: queue.Queue[tuple[RunWrite, bool] | None] = queue.Queue()
        for write in read_journal(journal) if resuming else []:
            self.queue.put((write, True))
        journal.parent.mkdir(parents=True, exist_ok=True)
        self._journal = journal.open("a")
        self.thread = threading.Thread(target=self._work, name="raybench-tracking-writer", daemon=True)
        self.thread.start()

    @classmethod
    def for_stage(cls, uri: str, parent_id: str, journal: Path, resuming: bool,
                  experiment: str = EXPERIMENT) -> TrialRunWriter:
        with cls._lock:
            writer = cls._open.get(journal)
            if writer is None:
                writer = cls._open[journal] = cls(uri, parent_id, journal, resuming, experiment)
            return writer

    @classmethod
    def drain_all(cls) -> None:
        """Wait until every write handed over in this process is in the store; raise the first write that failed."""
        for writer in list(cls._open.values()):
            writer.drain()

    @classmethod
    def close_all(cls) -> None:
        """Drain every writer, without raising (the sweep is ending: a failed write is already its error), and
        stop their threads."""
        with cls._lock:
            writers, cls._open = list(cls._open.values()), {}
        for writer in writers:
            writer.close()

    def submit(self, write: RunWrite) -> None:
        self._raise_failure()
        self._journal.write(write.line() + "\n")
        self._journal.flush()  # in the kernel's hands: a killed driver's journal still has it
        self.queue.put((write, False))

    def drain(self) -> None:
        start = time.perf_counter()
        self.queue.join()
        tracking_client.PROCESS_STATS.seconds += time.perf_counter() - start
        self._raise_failure()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.drain()
        self.queue.put(None)
        self.thread.join()
        self._journal.close()

    def _raise_failure(self) -> None:
        if self.error is not None and not self.error_raised:
            self.error_raised = True
            if isinstance(self.error, StorageFull):  # exit 74, as any full disk: the sweep resumes once freed
                raise self.error
            raise TrackingError(f"tracking store {redact_uri(self.tracker.uri)}: {self.error}") from self.error

    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                if self.error is None:
                    self._apply(*item)
            except Exception as err:  # noqa: BLE001  kept for the sweep's thread to raise; the journal keeps the write
                self.error = err
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def _apply(self, write: RunWrite, replayed: bool) -> None:
        if write.kind is WriteKind.OPEN:
            self._open_run(write, replayed)
            return
        run = self.runs[write.key]
        if write.kind is WriteKind.EPOCH:
            self._log_epoch(run, write, replayed)
        elif write.kind is WriteKind.TAGS:
            self.tracker.set_tags(run, write.tags)
        elif write.kind is WriteKind.STAGE and write.stage is not None:
            self._log_stage(run, write)
        elif write.kind is WriteKind.END:
            self._end(run, write)

    def _open_run(self, write: RunWrite, replayed: bool) -> None:
        """A key seen before in this process (a repeated config, a replayed record, a run the journal named)
        reuses its run, set running again as a resumed run is."""
        key = write.key
        if key not in self.runs:
            self.runs[key], self.logged_through[key] = self.tracker.open_child(
                key, write.run_name, write.params, write.tags, look_up=self.resuming)
        elif not replayed and (key in self.ended or key not in self.live):
            self.tracker.client.update_run(self.runs[key], status=RUN_RUNNING)
        if not replayed:
            self.live.add(key)
            self.ended.discard(key)

    def _log_epoch(self, run: str, write: RunWrite, replayed: bool) -> None:
        """An epoch the store already has (a resumed trial ran it again after its last checkpoint) sends only
        its tags; one written again from the journal is sent whole, as its metrics keep their time."""
        if not replayed and write.step <= self.logged_through[write.key]:
            if write.tags:
                self.tracker.set_tags(run, write.tags)
            return
        self.tracker.log_metrics(run, write.metrics, step=write.step, tags=write.tags, timestamp_ms=write.timestamp_ms)
        self.logged_through[write.key] = max(self.logged_through[write.key], write.step)

    def _log_stage(self, run: str, write: RunWrite) -> None:
        stage_key = f"{write.key}/{write.stage['name']}"
        if stage_key not in self.stages:
            self.tracker.log_stage(run, write.key, write.stage, look_up=self.resuming)
            self.stages.add(stage_key)

    def _end(self, run: str, write: RunWrite) -> None:
        tags = write.tags
        if write.metrics:  # what the run used, with the tags in one request
            self.tracker.log_metrics(run, write.metrics, step=write.step, tags=tags, timestamp_ms=write.timestamp_ms)
            tags = {}
        self.tracker.end_child(run, write.status, reason=write.reason, tags=tags)
        self.ended.add(write.key)

