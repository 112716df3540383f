"""A sweep's records in the tracking store and under --storage, read back by name whatever the name holds, and
trusted only as the sweep they are read for: a summary.json nested past any record, copied from another sweep, or
holding no finite number is damaged (one line naming the sweep and the file); a sweep's name is one sweep in the
store, so a driver of another --storage, or one that created its parent at the same moment, is refused before
any child run.
"""
from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from raybench import tracking
from raybench.commands.benchmark import DamagedSummary, sweep_summary
from raybench.records import MAX_RECORD_DEPTH, RecordError, SweepState
from raybench.sweep import runner
from raybench.tracking import (
    STORAGE_TAG,
    SWEEP_TAG,
    DamagedRecord,
    RecordedSweep,
    SweepTracker,
    TrackingError,
    find_recorded_sweep,
    find_sweeps,
    load_sweep_results,
    read_summary_text,
    reading,
)
from raybench.tracking import client as store_client
from raybench.tracking.sweep_writer import SweepClaimed

FAST = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


def summary(name: str, **changes) -> dict:
    """A finished sweep's summary.json as raybench writes it: two replicates, one cell."""
    base = {"name": name, "dataset": "digits-shift", "algorithm": "erm", "state": "finished",
            "selection": {"strategy": "ood_val", "metric": "val/acc", "label": "OOD val"},
            "trials": [{"trial_id": "t", "status": "ok", "selection_value": 0.5, "metrics": {"best/test/acc": 0.5,
                                                                                             "time/wall_s": 3.0}}],
            "selected": {"trial_id": "t", "status": "ok", "selection_value": 0.5},
            "replicates": {"seeds": [1, 2], "ok": 2, "summary": {"best/test/acc": {"mean": 0.55, "std": 0.07, "n": 2}},
                           "runs": [{"trial_id": "r1", "status": "ok", "metrics": {"best/test/acc": 0.5}},
                                    {"trial_id": "r2", "status": "ok", "metrics": {"best/test/acc": 0.6}}]},
            "wall_seconds": 12.0}
    return {**base, **changes}


def record_sweep(uri: str, name: str, text: str, tmp_path: Path, dataset: str = "digits-shift") -> str:
    """A finished sweep's parent run holding `text` as its results/summary.json; its run id."""
    tracker = SweepTracker(uri)
    tracker.start_sweep(name, params={}, tags={"dataset": dataset, "algorithm": "erm"})
    folder = tmp_path / "artifacts" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(text)
    tracker.log_artifacts(folder, "results")
    tracker.end_sweep("FINISHED")
    return tracker.parent_id


def one_line(shown, code: int = 2) -> str:
    assert shown.returncode == code, (shown.returncode, shown.stderr)
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in shown.stderr, shown.stderr
    return lines[0]


# ----- names and datasets in MLflow's search filters ----------------------------------------------------------
UNQUOTABLE = "'\"\\\n\t\x00\x1f"  # no MLflow literal holds them (as a name's last character, a backslash)
WILDCARDS = "%_"  # LIKE's
HOSTILE_NAMES = st.builds(
    str.__add__,
    st.text(st.one_of(st.sampled_from(list(UNQUOTABLE + WILDCARDS + " `*?[]")), st.sampled_from(list("abAB0")),
                      st.characters(exclude_categories=("Cs",))), max_size=16),
    st.sampled_from(["", "\\", "'", '"', "%", "_", "x"])).filter(bool)


def decoys(name: str) -> list[str]:
    """Names a LIKE pattern or a loose filter for `name` would also match, and a longer one."""
    widened = "".join("z" if c in UNQUOTABLE + WILDCARDS or not c.isprintable() else c for c in name)
    return sorted({widened, widened.upper(), name + "x", "x" + name} - {name})


def parent_of(client: MlflowClient, experiment_id: str, name: str) -> str:
    return client.create_run(experiment_id, run_name="x", tags={SWEEP_TAG: name, "stage": "sweep"}).info.run_id


@FAST
@given(name=HOSTILE_NAMES)
def test_a_sweep_is_found_by_its_exact_name_whatever_the_name_holds(name, store_uri):
    """Quotes, a trailing backslash, `%` and `_` (LIKE's wildcards): found, and no run of a similar name is."""
    tracker = SweepTracker(store_uri)
    client, experiment = tracker.client, tracker.experiment_id
    for decoy in decoys(name):
        parent_of(client, experiment, decoy)
    mine = parent_of(client, experiment, name)
    for decoy in decoys(name):  # later ones too: the latest match is not taken on trust
        parent_of(client, experiment, decoy)
    recorded = find_recorded_sweep(store_uri, name)
    assert recorded is not None and recorded.run_id == mine
    assert reading._sweep_parent(store_uri, name)[1].info.run_id == mine
    assert tracker._find({SWEEP_TAG: name, "stage": "sweep"}).info.run_id == mine


@pytest.mark.parametrize("name", ["back\\", "o'br\"ien\\", "100%", "a_b", "it's", 'say "x"', "\\'", "tab\there"])
def test_results_and_compare_read_a_hostile_name_and_dataset_exactly(name, store_uri, tmp_path, capsys):
    record_sweep(store_uri, name, json.dumps(summary(name, dataset=name)), tmp_path, dataset=name)
    for decoy in decoys(name):
        record_sweep(store_uri, decoy, json.dumps(summary(decoy, dataset=decoy)), tmp_path, dataset=decoy)
    shown = cli(["results", name, "--format", "json", "--tracking-uri", store_uri], capsys)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == name
    compared = cli(["compare", "--dataset", name, "--format", "json", "--tracking-uri", store_uri], capsys)
    assert compared.returncode == 0, compared.stderr
    assert [row["sweep"] for row in json.loads(compared.stdout)["rows"]] == [name]
    assert [r.name for r in find_sweeps(store_uri, dataset=name)] == [name]


def test_a_filter_value_is_read_back_by_mlflow_as_given():
    """The filter itself: literal where MLflow reads it back, else a LIKE with the unquotable characters as `_`."""
    assert store_client.tag_filter({"a": "plain", "b": "100%"}) == "tags.`a` = 'plain' and tags.`b` = '100%'"
    assert store_client.tag_filter({"a": "it's", "b": "x"}) == "tags.`a` = \"it's\" and tags.`b` = 'x'"
    assert store_client.tag_filter({"a": "back\\", "b": "x"}) == "tags.`a` LIKE 'back_' and tags.`b` = 'x'"


# ----- summary.json nested past any record --------------------------------------------------------------------
def nested(depth: int, brackets: str = "[]") -> str:
    """JSON nested `depth` levels deep, in lists or in mappings."""
    return "[" * depth + "]" * depth if brackets == "[]" else '{"a": ' * depth + "1" + "}" * depth


def deep_summary(name: str, depth: int, brackets: str = "[]") -> str:
    return json.dumps(summary(name))[:-1] + f', "extra": {nested(depth, brackets)}}}'


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(depth=st.one_of(st.integers(MAX_RECORD_DEPTH + 1, 3000), st.sampled_from([100_000, 250_000])),
       brackets=st.sampled_from(["[]", "{}"]))
def test_a_summary_nested_past_any_record_is_damaged_not_a_recursion_error(depth, brackets):
    with pytest.raises(RecordError, match=f"nested deeper than {MAX_RECORD_DEPTH} levels"):
        read_summary_text(deep_summary("s", depth, brackets), "s")


@pytest.mark.parametrize("text, why", [
    ('{"name": "cut", "dataset": "digits-', "not JSON"),
    ("[]", "a JSON list, not a mapping"),
    (json.dumps(summary("other")), "it is the record of sweep 'other', not of 's'"),
    (json.dumps({**summary("s"), "schema_version": 99}), "schema version 99, newer than this raybench"),
    (json.dumps({**summary("s"), "schema_version": "1"}), "'schema_version' is not a whole number"),
])
def test_every_damage_of_a_summary_is_one_damaged_record_whoever_reads_it(text, why):
    """One reader and one exception: a RecordError to the readers of records under --storage (a resume, a
    benchmark), a TrackingError to the commands that read the store, its words the damage alone."""
    with pytest.raises(DamagedRecord) as caught:
        read_summary_text(text, "s")
    assert isinstance(caught.value, RecordError) and isinstance(caught.value, TrackingError)
    assert why in str(caught.value) and str(caught.value) == caught.value.damage


def test_a_summary_as_deep_as_a_record_may_be_is_read():
    text = json.dumps(summary("s"))[:-1] + f', "extra": {nested(MAX_RECORD_DEPTH - 1)}}}'
    assert read_summary_text(text, "s").name == "s"
    assert read_summary_text(json.dumps(summary("s", note='[[[[' * 40 + '"\\" [')), "s").name == "s"  # in strings


def test_a_deep_summary_in_the_store_is_one_line_for_results_and_named_by_compare(store_uri, tmp_path, capsys):
    record_sweep(store_uri, "deep", deep_summary("deep", 100_000), tmp_path)
    record_sweep(store_uri, "good", json.dumps(summary("good")), tmp_path)
    line = one_line(cli(["results", "deep", "--tracking-uri", store_uri], capsys))
    assert line.startswith("raybench: error: results: sweep deep: its results/summary.json (run ") and \
        f"is damaged: nested deeper than {MAX_RECORD_DEPTH} levels" in line
    compared = cli(["compare", "--stats", "--format", "json", "--tracking-uri", store_uri], capsys)
    assert compared.returncode == 0 and "Traceback" not in compared.stderr
    read = json.loads(compared.stdout)
    assert [row["sweep"] for row in read["rows"]] == ["good"]
    (deep,) = read["unfinished"]
    assert deep["name"] == "deep" and deep["line"].startswith("sweep deep: its results/summary.json (run ")


def test_a_deep_or_foreign_summary_under_storage_is_resumed_not_a_traceback(tmp_path, capsys):
    """`sweep --resume` of a finished sweep reads its summary.json under --storage: a damaged one is named and
    the sweep resumes (which writes it anew); the benchmark's reader names it the same way."""
    storage = tmp_path / "runs"
    results = storage / "s" / "results"
    results.mkdir(parents=True)
    prepared = SimpleNamespace(storage=storage, name="s")
    finished = RecordedSweep("run-1", {}, "FINISHED", tracking.SweepStanding(SweepState.FINISHED.value, None))
    for text, why in [(deep_summary("s", 100_000), "nested deeper than"),
                      (json.dumps(summary("other")), "it is the record of sweep 'other', not of 's'"),
                      (json.dumps(summary("s", mlflow={"run_id": "run-2"})), "the parent run 'run-2', not of 'run-1'")]:
        (results / "summary.json").write_text(text)
        capsys.readouterr()
        assert runner.finished_summary(prepared, finished) is None
        said = capsys.readouterr().out.strip()
        assert said.startswith(f"sweep s: {results / 'summary.json'} is damaged (") and why in said, said
        assert "\n" not in said
    (results / "summary.json").write_text(deep_summary("s", 100_000))
    with pytest.raises(DamagedSummary, match="is damaged: nested deeper than"):
        sweep_summary(storage, SimpleNamespace(sweep="s"))
    (results / "summary.json").write_text(json.dumps(summary("s", mlflow={"run_id": "run-1"})))
    assert runner.finished_summary(prepared, finished).name == "s"


# ----- a summary copied from another sweep --------------------------------------------------------------------
def test_a_summary_copied_from_another_sweep_is_damaged_naming_both(store_uri, tmp_path, capsys):
    record_sweep(store_uri, "copied", json.dumps(summary("original")), tmp_path)
    other = record_sweep(store_uri, "other", json.dumps(summary("other")), tmp_path)
    mine = record_sweep(store_uri, "samename", json.dumps(summary("samename", mlflow={"run_id": other})), tmp_path)
    line = one_line(cli(["results", "copied", "--tracking-uri", store_uri], capsys))
    assert "is damaged: it is the record of sweep 'original', not of 'copied'" in line, line
    line = one_line(cli(["results", "samename", "--tracking-uri", store_uri], capsys))
    assert f"is damaged: it is the record of the parent run '{other}', not of '{mine}'" in line, line
    records = {r.name: r for r in find_sweeps(store_uri)}
    assert records["copied"].summary is None and records["other"].summary is not None
    assert load_sweep_results(store_uri, "other").name == "other"


# ----- numbers that are no results ----------------------------------------------------------------------------
NAN, INF = math.nan, math.inf


def no_finite_numbers(name: str, value: float) -> dict:
    cell = {"mean": value, "std": value, "n": value}
    run = {"trial_id": "r", "status": "ok", "metrics": {"best/test/acc": value}, "selection_value": value}
    return summary(name, trials=[{**run, "trial_id": "t"}], selected={**run, "trial_id": "t"}, wall_seconds=value,
                   replicates={"seeds": [], "ok": 2, "runs": [run, run], "summary": {"best/test/acc": cell}})


@pytest.mark.parametrize(("changes", "why"), [
    (no_finite_numbers("s", NAN), "'replicates.summary.best/test/acc' has the mean nan, expected a finite number"),
    (no_finite_numbers("s", INF), "'replicates.summary.best/test/acc' has the mean inf, expected a finite number"),
    ({"replicates": {"seeds": [1], "ok": 1, "runs": [], "summary": {"best/test/acc": {"mean": 0.5, "std": -INF,
                                                                                        "n": 1}}}},
     "has the std -inf, expected a finite number or NaN"),
    ({"replicates": {"seeds": [1], "ok": 1, "runs": [], "summary": {"best/test/acc": {"mean": 0.5, "n": 0}}}},
     "has the count n 0, expected a whole number >= 1"),
    ({"replicates": {"seeds": [1], "ok": 1, "runs": [], "summary": {"best/test/acc": {"std": 0.1, "n": 1}}}},
     "has the mean None, expected a finite number"),
    ({"selected": {"trial_id": "t", "status": "ok", "selection_value": NAN}}, "'selected.selection_value' is nan"),
    ({"trials": [{"trial_id": "t", "status": "ok", "metrics": {"best/test/acc": NAN}}], "selected": None,
      "wall_seconds": INF, "replicates": {"seeds": [], "ok": 0, "runs": [], "summary": {}}},
     "its numbers are all NaN or infinite"),
])
def test_a_summary_whose_numbers_are_no_results_is_damaged(changes, why, store_uri, tmp_path, capsys):
    name = "s"
    record_sweep(store_uri, name, json.dumps({**summary(name), **changes, "name": name}), tmp_path)
    line = one_line(cli(["results", name, "--tracking-uri", store_uri], capsys))
    assert why in line, line
    compared = cli(["compare", "--stats", "--tracking-uri", store_uri], capsys)
    assert compared.returncode == 0 and "Traceback" not in compared.stderr
    assert f"- sweep {name}: its results/summary.json" in compared.stdout and why in compared.stdout
    assert "No finished sweep matches." in compared.stdout  # the damaged sweep has no row of NaN cells


def test_a_single_replicate_std_of_nan_is_a_result():
    """outcome.summarize writes std NaN for one replicate: that is no damage."""
    text = json.dumps(summary("s", replicates={"seeds": [1], "ok": 1, "runs": [], "summary": {
        "best/test/acc": {"mean": 0.5, "std": NAN, "n": 1}}}))
    assert read_summary_text(text, "s").replicates.summary["best/test/acc"]["n"] == 1


# ----- one name, one sweep, one storage -----------------------------------------------------------------------
def active_parents(uri: str, name: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    return store_client.runs_tagged(client, experiment.experiment_id, {SWEEP_TAG: name, "stage": "sweep"})


def children_of(uri: str, parent: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    return store_client.runs_tagged(client, experiment.experiment_id, {tracking.PARENT_TAG: parent})


def test_a_parent_records_its_storage_and_a_driver_of_another_is_refused(store_uri, tmp_path):
    first = SweepTracker(store_uri).start_sweep("s", {}, {}, storage=tmp_path / "a", resuming=False)
    assert active_parents(store_uri, "s")[0].data.tags[STORAGE_TAG] == str(tmp_path / "a")
    other = SweepTracker(store_uri)
    with pytest.raises(SweepClaimed, match=f"--storage: sweep 's' belongs to the storage {tmp_path / 'a'} .*got "
                                           f"{tmp_path / 'b'}; pass --storage {tmp_path / 'a'}"):
        other.start_sweep("s", {}, {}, storage=tmp_path / "b", resuming=True)
    with pytest.raises(SweepClaimed, match="--name: sweep 's' was just started by another driver"):
        other.start_sweep("s", {}, {}, storage=tmp_path / "a", resuming=False)
    assert other.parent_id is None
    again = SweepTracker(store_uri).start_sweep("s", {}, {}, storage=tmp_path / "a", resuming=True)
    assert again == first and [r.info.run_id for r in active_parents(store_uri, "s")] == [first]
    assert children_of(store_uri, first) == []


def test_a_parent_from_before_storages_were_recorded_is_resumed_and_then_names_its_storage(store_uri, tmp_path):
    tracker = SweepTracker(store_uri)
    old = parent_of(tracker.client, tracker.experiment_id, "s")
    assert tracker.start_sweep("s", {}, {}, storage=tmp_path / "a", resuming=True) == old
    assert active_parents(store_uri, "s")[0].data.tags[STORAGE_TAG] == str(tmp_path / "a")


def test_of_two_drivers_creating_one_sweep_at_once_the_later_deletes_its_parent(store_uri, tmp_path, monkeypatch):
    """Both looked before either created a parent (find_recorded_sweep saw none, and so did start_sweep's own
    look): the earlier parent keeps the name, the later driver deletes its own and is refused, no child run."""
    early = SweepTracker(store_uri)
    monkeypatch.setattr(SweepTracker, "_find", lambda self, tags: None)  # each looked before the other created
    winner = early.start_sweep("race", {}, {}, storage=tmp_path / "a", resuming=False)
    late = SweepTracker(store_uri)
    with pytest.raises(SweepClaimed, match=f"at the same moment \\(its parent run {winner}, storage "
                                           f"{tmp_path / 'a'}\\); this driver stopped before running anything"):
        late.start_sweep("race", {}, {}, storage=tmp_path / "b", resuming=False)
    assert [run.info.run_id for run in active_parents(store_uri, "race")] == [winner]
    assert late.parent_id is None and children_of(store_uri, winner) == []
    deleted = MlflowClient(tracking_uri=store_uri).search_runs(
        [early.experiment_id], "tags.`raybench.sweep` = 'race'", run_view_type=2)  # DELETED_ONLY
    assert len(deleted) == 1 and deleted[0].data.tags[STORAGE_TAG] == str(tmp_path / "b")


def test_the_earlier_of_two_parents_goes_on_when_the_later_one_looks_first(store_uri, tmp_path, monkeypatch):
    """The earlier creator may look after the later one has created: it sees both and is still the one kept."""
    tracker = SweepTracker(store_uri)
    monkeypatch.setattr(SweepTracker, "_find", lambda self, tags: None)
    created = tracker.client.create_run

    def then_another_driver_creates(*args, **kwargs):
        run = created(*args, **kwargs)
        created(tracker.experiment_id, run_name="race", tags={SWEEP_TAG: "race", "stage": "sweep",
                                                              STORAGE_TAG: str(tmp_path / "b")})
        return run

    monkeypatch.setattr(tracker.client, "create_run", then_another_driver_creates, raising=False)
    mine = tracker.start_sweep("race", {}, {}, storage=tmp_path / "a", resuming=False)
    assert mine == tracker.parent_id and len(active_parents(store_uri, "race")) == 2  # the other one deletes its own


@pytest.mark.parametrize("resume", [False, True])
def test_a_driver_of_another_storage_is_refused_before_any_run(resume, store_uri, tmp_path, shared_data_dir,
                                                               monkeypatch, capsys):
    """Through the command line: the sweep's parent names storage A; a driver on storage B (a new sweep, or a
    --resume of B's own folders of that name) is one line naming A, exit 2, and the store is as it was."""
    from helpers.cli import fail_on_reaching

    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    fail_on_reaching(monkeypatch, (runner.RaySession, "start"))
    parent = SweepTracker(store_uri).start_sweep("s", {}, {}, storage=(tmp_path / "a").resolve(), resuming=False)
    (tmp_path / "b" / "s").mkdir(parents=True)  # B's own folders of a sweep named s
    storage = tmp_path / ("b" if resume else "c")  # a new sweep's storage has no folders of it
    shown = cli(["sweep", "erm", "--smoke", "--name", "s", "--storage", str(storage), "--tracking-uri", store_uri,
                 *(["--resume"] if resume else [])], capsys)
    line = one_line(shown)
    if resume:
        assert line == (f"raybench: error: --storage: sweep 's' belongs to the storage {(tmp_path / 'a').resolve()} "
                        f"(so its parent run in the tracking store says), got {(tmp_path / 'b').resolve()}; pass "
                        f"--storage {(tmp_path / 'a').resolve()} to resume it, or another --name"), line
    else:
        assert "already exists in the tracking store" in line and \
            f"pass --resume (with its --storage {(tmp_path / 'a').resolve()})" in line, line
    assert [run.info.run_id for run in active_parents(store_uri, "s")] == [parent]
    assert children_of(store_uri, parent) == []


def test_a_driver_that_finds_its_new_sweep_started_meanwhile_is_refused_before_any_child(
        store_uri, tmp_path, shared_data_dir, monkeypatch, capsys):
    """Through the runner: this driver saw no parent of `s` (a new sweep); while its Ray started, another driver
    of another storage created one. This driver neither takes it over nor makes a second: one line, exit 2."""
    from helpers.cli import fail_on_reaching

    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    other: list[str] = []

    def start_while_another_driver_starts(session, work):
        other.append(SweepTracker(store_uri).start_sweep("s", {}, {}, storage=tmp_path / "a", resuming=False))
        session.backend = SimpleNamespace(Resources=lambda *args, **kwargs: None,
                                          check_resources=lambda *args, **kwargs: None)
        return work()

    monkeypatch.setattr(runner.RaySession, "start_beside", start_while_another_driver_starts)
    fail_on_reaching(monkeypatch, (runner, "_search_and_replicate"))
    shown = cli(["sweep", "erm", "--smoke", "--name", "s", "--storage", str(tmp_path / "b"), "--tracking-uri",
                 store_uri], capsys)
    line = one_line(shown)
    assert line.startswith(f"raybench: error: --name: sweep 's' was just started by another driver (its parent run "
                           f"{other[0]}, storage {tmp_path / 'a'})"), line
    assert [run.info.run_id for run in active_parents(store_uri, "s")] == other
    assert children_of(store_uri, other[0]) == []
