"""A sweep's `results/summary.json` read back as its typed record, whoever reads it: a sweep's driver checking a
finished sweep under --storage, a benchmark looking at its pairs, and `results` and `compare` reading the copy on
the parent run. One reader (read_summary_text) and one exception (DamagedRecord) for every way the file can be
damaged, so each caller names the damage in its own words and none meets a traceback.
"""
from __future__ import annotations

from typing import Any

import raybench
from raybench.records import RecordError, SweepSummary, loads_record, summary_numbers_problem
from raybench.report_keys import SCHEMA_VERSION, SUMMARY_SCHEMA
from raybench.tracking.store import TrackingError

SUMMARY_ARTIFACT = "results/summary.json"  # on a sweep's parent run, as under <storage>/<name>/


class DamagedRecord(RecordError, TrackingError):
    """A summary.json no reader can use; `damage` says why, in words a caller puts after the file's name.

    A RecordError, as every stored record that is not shaped like one is (a reader of records catches that), and
    a TrackingError, as everything reading the tracking store fails with (a command prints it as one line). A
    sweep's copy on its parent run names the sweep and the run (in_store): `compare` skips that sweep, naming it,
    and reads the others."""

    def __init__(self, damage: str, message: str | None = None) -> None:
        super().__init__(message or damage)
        self.damage = damage

    def in_store(self, name: str, run_id: str) -> DamagedRecord:
        """The same damage, found in the copy on sweep `name`'s parent run `run_id`."""
        return DamagedRecord(self.damage, f"sweep {name}: its {SUMMARY_ARTIFACT} (run {run_id}) is damaged: "
                                          f"{self.damage}; skipped")


def read_summary_text(text: str, name: str | None = None, run_id: str | None = None) -> SweepSummary:
    """A summary.json's text as the typed record, parsed without trusting its nesting (records.loads_record); a
    DamagedRecord saying why it cannot be a sweep's results: not JSON, nested past any record, not a mapping, a
    schema version this raybench does not read, a key missing or of the wrong type (the keys are
    SweepSummary.from_json's to judge), numbers that are no results (records.summary_numbers_problem), or the
    record of another sweep: read for sweep `name` (and its parent run `run_id`), a summary names both, so one
    copied from another sweep, or from a sweep of that name in another store, is not taken for this one's."""
    try:
        return _summary(loads_record(text), name, run_id)
    except DamagedRecord:
        raise
    except RecordError as err:
        raise DamagedRecord(str(err)) from None


def _summary(data: Any, name: str | None, run_id: str | None) -> SweepSummary:
    version = data.get(SCHEMA_VERSION, 0) if isinstance(data, dict) else 0
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise DamagedRecord(f"{SCHEMA_VERSION!r} is not a whole number >= 0")
    if version > SUMMARY_SCHEMA:
        raise DamagedRecord(f"schema version {version}, newer than this raybench {raybench.__version__} reads "
                            f"(up to {SUMMARY_SCHEMA}): read it with the raybench that wrote it")
    summary = SweepSummary.from_json(data)
    problem = summary_numbers_problem(data)
    if problem:
        raise DamagedRecord(problem)
    if name is not None and summary.name != name:
        raise DamagedRecord(f"it is the record of sweep {summary.name!r}, not of {name!r} (copied from another sweep?)")
    recorded_run = (summary.mlflow or {}).get("run_id")
    if run_id is not None and recorded_run is not None and recorded_run != run_id:
        raise DamagedRecord(f"it is the record of the parent run {recorded_run!r}, not of {run_id!r} (copied from "
                            f"another sweep of that name?)")
    return summary
