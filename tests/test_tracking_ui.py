"""What the MLflow UI shows: a model-training experiment (opens on the runs) and the sweep's summary as the
parent run's description."""
from __future__ import annotations

from mlflow.tracking import MlflowClient

from raybench.tracking import SweepTracker
from raybench.tracking.names import DESCRIPTION_TAG, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from raybench.tracking.sweep_writer import DESCRIPTION_LIMIT, run_description


def test_a_new_experiment_is_a_model_training_one_and_an_old_one_is_marked(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    SweepTracker(uri, experiment="fresh")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name("fresh").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    client.create_experiment("made-before")  # as raybench made them before this tag existed
    assert EXPERIMENT_KIND_TAG not in client.get_experiment_by_name("made-before").tags
    SweepTracker(uri, experiment="made-before")
    assert client.get_experiment_by_name("made-before").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND


def test_the_summary_becomes_the_parent_runs_description(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = SweepTracker(uri)
    parent = tracker.start_sweep("s", {}, {})
    tracker.log_summary("# s: erm on tiny\n\nSelected trial `abc_00003`\n", {"x": 1.0})
    description = MlflowClient(tracking_uri=uri).get_run(parent).data.tags[DESCRIPTION_TAG]
    assert "Selected trial `abc_00003`" in description


def test_a_long_summary_is_cut_at_a_line_end_under_mlflows_limit():
    head = "# sweep\n\nSelected trial `t_00001`\n"
    rows = "".join(f"| `t_{i:05d}` | ok | 0.5 | 1 |\n" for i in range(1000))
    description = run_description(head + rows)
    assert len(description) <= DESCRIPTION_LIMIT and description.startswith(head)
    assert "summary.md" in description.splitlines()[-1]
    kept = description[len(head):].split("\n\n")[0]
    assert all(line.startswith("| `t_") and line.endswith("|") for line in kept.splitlines())  # whole rows only
    assert run_description(head) == head


def test_run_names_show_the_searched_values_or_the_seed_and_stay_short():
    from raybench.sweep.ray_callbacks import MAX_RUN_NAME, readable_run_name

    assert readable_run_name("search", "04b9f3575751", {"lr": 0.0019583, "unlabeled_ratio": 7}, 0) == \
        "search 04b9f357: lr=0.00196, unlabeled_ratio=7"
    assert readable_run_name("replicate", "04b9f3575751-seed2871", {"lr": 0.0019583}, 2871) == "replicate 04b9f357: seed 2871"
    long = readable_run_name("search", "04b9f3575751", {f"hparam_{i}": 0.5 for i in range(30)}, 0)
    assert len(long) == MAX_RUN_NAME and long.endswith("…")


def test_reading_a_missing_sqlite_store_says_so_and_creates_nothing(tmp_path):
    import pytest

    from raybench.tracking import TrackingError, find_sweeps, load_sweep_results

    uri = f"sqlite:///{tmp_path}/nowhere/mlflow.db"
    for read in (lambda: find_sweeps(uri), lambda: load_sweep_results(uri, "s")):
        with pytest.raises(TrackingError, match="no MLflow store at .*nowhere/mlflow.db' does not exist"):
            read()
    assert not (tmp_path / "nowhere").exists()


def test_reading_a_sqlite_file_that_is_not_an_mlflow_store_refuses_it_and_writes_nothing(tmp_path):
    """`results` and `compare` once wrote MLflow's 65 tables into any SQLite file they were given, and a damaged
    one ended in an SQLAlchemy traceback; now both are one line naming the file, and the file is untouched."""
    import sqlite3

    import pytest

    from raybench.tracking import TrackingError, find_sweeps, load_sweep_results

    unrelated = tmp_path / "notes.db"
    with sqlite3.connect(unrelated) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('keep me')")
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x07" * 500)
    for path, message in ((unrelated, "has no MLflow tables \\(its tables: notes\\)"),
                          (damaged, "is not a readable SQLite database")):
        before = path.read_bytes()
        uri = f"sqlite:///{path}"
        for read in (lambda uri=uri: find_sweeps(uri), lambda uri=uri: load_sweep_results(uri, "s")):
            with pytest.raises(TrackingError, match=f"no MLflow store at .*{path.name}'? {message}"):
                read()
        assert path.read_bytes() == before, f"{path.name} was written to"
    with sqlite3.connect(unrelated) as db:
        assert [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["notes"]
