"""The typed results contract (raybench/records.py): a summary.json reads into typed records and writes back as the
same bytes, statuses and states are the words stored before they were enums, older records load with defaults, and
a record no reader can use is named. The records module stays on the ground floor."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_layers import imported_modules

from raybench.records import (
    Importances,
    PairState,
    ParamImportance,
    RecordError,
    Replicates,
    Selection,
    SweepState,
    SweepSummary,
    TrialRecord,
    TrialStatus,
)
from raybench.report import results
from raybench.report_keys import CLOCK_STAMPS, SCHEMA_VERSION, SUMMARY_SCHEMA
from raybench.sweep import outcome

STORED = Path(__file__).parent / "stored" / "summary_before_schema_version.json"
RECORDS = Path(__file__).resolve().parents[1] / "raybench" / "records.py"
# The keys as runner._summary and collect() wrote them before they were typed, in their order.
SUMMARY_KEYS = ["name", "state", "selection_blind", "dataset", "algorithm", "space", "space_scales", "raybench_version",
                SCHEMA_VERSION, "selection", "metric_names", "report", "trials", "selected", "replicates",
                "wall_seconds", "compute", "tracking", "mlflow"]
TRIAL_KEYS = ["order", "trial_id", "seed", "sampled", "status", "failure_reason", "selection_value", "best_epoch",
              "selection_blind", "selection_note", "metrics", "checkpoint", "node"]


@pytest.fixture
def stored() -> dict:
    return json.loads(STORED.read_text())


def test_a_stored_summary_reads_and_writes_back_as_the_same_bytes(stored, tmp_path):
    """Version 0 (no schema_version) stays version 0: the file a sweep wrote is the file its records write."""
    summary = SweepSummary.from_json(stored)
    assert summary.schema_version == 0 and SCHEMA_VERSION not in summary.to_json()
    assert summary.to_json() == stored and list(summary.to_json()) == [k for k in SUMMARY_KEYS if k in stored]
    assert SweepSummary.from_json(summary.to_json()) == summary
    results.write_results(tmp_path, summary, results.trials_frame(summary.trials),
                          results.replicates_frame(summary.replicates.runs))
    assert (tmp_path / "summary.json").read_text() == STORED.read_text()


def test_a_summary_of_this_schema_round_trips_with_its_version(stored):
    current = {**stored, SCHEMA_VERSION: SUMMARY_SCHEMA}
    summary = SweepSummary.from_json(current)
    assert summary.schema_version == SUMMARY_SCHEMA and summary.to_json() == current
    assert list(summary.to_json()) == SUMMARY_KEYS


def test_a_summary_made_in_code_writes_todays_keys_in_order_with_schema_version_1():
    trial = TrialRecord(0, "t0", 0, {"lr": 0.1}, TrialStatus.STOPPED, selection_value=0.5, checkpoint="/driver/ckpt")
    summary = SweepSummary(name="s", dataset="d", algorithm="erm", selection=Selection("ood_val", "val/acc", "OOD val acc"),
                           trials=[trial], selected=trial, replicates=Replicates(), report={}, compute={},
                           tracking={"calls": 1.0}, mlflow={"run_id": "r"})
    written = summary.to_json()
    assert list(written) == SUMMARY_KEYS and written[SCHEMA_VERSION] == SUMMARY_SCHEMA == 1
    assert written["state"] == "finished" and type(written["state"]) is str
    assert list(written["trials"][0]) == [k for k in TRIAL_KEYS if k != "checkpoint"]  # no driver path on disk
    assert list(trial.to_json()) == TRIAL_KEYS and trial.to_json()["checkpoint"] == "/driver/ckpt"
    assert written["trials"][0]["status"] == "stopped early" and type(written["trials"][0]["status"]) is str
    assert written["selection"] == {"strategy": "ood_val", "metric": "val/acc", "label": "OOD val acc"}


def test_keys_a_summary_never_recorded_stay_out_of_what_it_writes(stored):
    """A summary written before report, compute and analysis_only existed (or before tracking and mlflow were
    recorded) writes back without them; the readers see None."""
    for key in ("report", "compute", "tracking", "mlflow"):
        stored.pop(key)
    stored["selection"].pop("analysis_only")
    summary = SweepSummary.from_json(stored)
    assert (summary.report, summary.compute, summary.tracking, summary.mlflow) == (None, None, None, None)
    assert summary.selection.analysis_only is None and summary.to_json() == stored


KEPT = Importances("val/acc", "fANOVA (Optuna FanovaImportanceEvaluator, 64 trees, seed 0)", 3, 4,
                   (ParamImportance("lr", "log", 1.0, 0.8), ParamImportance("wd", "linear", reason="took one value")),
                   0.8, ("left out: 1 failed",))


def test_kept_importances_are_written_after_mlflow_and_read_back_typed(stored):
    """A sweep keeps the importances it rated (raybench.report.importance) as the summary's last key; they read back
    as the same typed record, and a summary that kept none writes none."""
    with_kept = {**stored, SCHEMA_VERSION: SUMMARY_SCHEMA, "importances": KEPT.to_json()}
    summary = SweepSummary.from_json(with_kept)
    assert summary.importances == KEPT and summary.to_json() == with_kept
    assert list(summary.to_json()) == [*SUMMARY_KEYS, "importances"]
    assert "importances" not in SweepSummary.from_json(stored).to_json()
    by_hand = {**with_kept, "importances": {**KEPT.to_json(), "explained": 1, "params": [{"name": "lr", "scale": "log",
                                                                                     "share": 1, "main_effect": 1}]}}
    assert SweepSummary.from_json(by_hand).importances.params[0].share == 1.0  # a whole number written as an int


@pytest.mark.parametrize(("edit", "named"), [
    (lambda kept: kept.pop("params"), "'importances.params' missing or not a list"),
    (lambda kept: kept["params"][1].update(share="high"), "'importances.params[1].share' is not a number"),
    (lambda kept: kept.update(explained=True), "'importances.explained' is not a number"),
    (lambda kept: kept.update(n_trials="3"), "'importances.n_trials' missing or not a int"),
])
def test_damaged_kept_importances_are_one_record_error_naming_the_key(stored, edit, named):
    kept = KEPT.to_json()
    edit(kept)
    with pytest.raises(RecordError) as refused:
        SweepSummary.from_json({**stored, "importances": kept})
    assert str(refused.value).startswith(named), refused.value


@pytest.mark.parametrize(("kind", "words"), [
    (TrialStatus, {"ok", "failed", "interrupted", "stopped early"}),
    (SweepState, {"finished", "running", "interrupted", "failed", "driver-gone", "interrupted during the search",
                  "interrupted during the replicates"}),
    (PairState, {"waiting", "running", "finished", "failed", "interrupted"}),
])
def test_enums_are_the_words_stored_before_them(kind, words):
    assert {member.value for member in kind} == words
    for member in kind:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value
        assert f"{member:>20}" == f"{member.value:>20}" and json.dumps({member: member}) == json.dumps({member.value: member.value})
        assert pd.DataFrame([{"s": member}]).to_csv(index=False) == f"s\n{member.value}\n"
        assert kind(member.value) is member


def test_an_interrupted_stage_names_its_state():
    assert SweepState.interrupted_during("search") is SweepState.INTERRUPTED_SEARCH
    assert SweepState.interrupted_during("replicates").value == "interrupted during the replicates"


def test_a_record_from_before_its_optional_keys_loads_with_their_defaults():
    older = {"order": 3, "trial_id": "abc", "seed": 7, "sampled": {"lr": 0.01}, "status": "ok", "failure_reason": None,
             "selection_value": 0.5, "best_epoch": 2, "metrics": {"best/test/acc": 0.4}}  # before blind/note, node
    trial = TrialRecord.from_json(older)
    assert trial.status is TrialStatus.OK and trial.status.selectable
    assert (trial.selection_blind, trial.selection_note, trial.node, trial.checkpoint) == (False, None, None, None)
    assert trial.to_json(public=True) == {**older, "selection_blind": False, "selection_note": None, "node": None}
    assert list(trial.to_json(public=True)) == [k for k in TRIAL_KEYS if k != "checkpoint"]


def test_a_summary_from_before_its_state_and_blindness_reads_as_finished(stored):
    for key in ("state", "selection_blind", "space_scales"):
        stored.pop(key)
    summary = SweepSummary.from_json(stored)
    assert summary.state is SweepState.FINISHED and summary.finished and summary.selection_blind is None
    assert summary.space_scales == {}


@pytest.mark.parametrize(("edit", "named"), [
    (lambda s: s.pop("trials"), "'trials' missing or not a list"),
    (lambda s: s.update(name=3), "'name' missing or not a str"),
    (lambda s: s["trials"][0].pop("trial_id"), "'trials[0].trial_id' missing or not a str"),
    (lambda s: s["trials"][0].update(status="TERMINATED"), "'trials[0].status' is 'TERMINATED', expected one of"),
    (lambda s: s["replicates"]["runs"].append([]), "'replicates.runs[1]' missing or not a dict"),
    (lambda s: s.update(state="paused"), "'state' is 'paused', expected one of 'finished'"),
    (lambda s: s["selected"].update(metrics=[1]), "'selected.metrics' is not a dict"),
])
def test_what_no_reader_can_use_is_one_record_error_naming_the_key(stored, edit, named):
    edit(stored)
    with pytest.raises(RecordError) as refused:
        SweepSummary.from_json(stored)
    assert str(refused.value).startswith(named), refused.value


def test_a_summary_that_is_not_a_mapping_is_named_as_such():
    with pytest.raises(RecordError, match="^a JSON list, not a mapping$"):
        SweepSummary.from_json([])


def test_readers_take_the_typed_records(stored):
    """results' selection and tables read the typed fields: the stored summary's selected trial is the one
    select_best picks again from its trials, and trials.csv holds the stored words."""
    summary = SweepSummary.from_json(stored)
    assert outcome.select_best(summary.trials) == summary.selected
    frame = results.trials_frame(summary.trials)
    assert list(frame["status"]) == [t["status"] for t in stored["trials"]] and frame["status"].map(type).eq(str).all()
    # a summary written before the wall-clock stamps were left out averaged them too; nothing else differs
    assert set(outcome.summarize(summary.replicates.runs)) == set(stored["replicates"]["summary"]) - CLOCK_STAMPS
    assert not CLOCK_STAMPS & set(outcome.summarize(summary.replicates.runs)), "a moment averaged over replicates"


def test_the_records_module_imports_only_the_standard_library_and_the_ground_floor():
    """Every layer reads records, so records may read nothing above the ground floor (tests/test_layers.py)."""
    allowed = ("raybench.report_keys", "raybench.errors")
    found = [module for _, module in imported_modules(RECORDS)]
    outside = [m for m in found if m.split(".")[0] not in sys.stdlib_module_names
               and not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert "raybench.report_keys" in found and outside == []
