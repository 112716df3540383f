"""The benchmark planner trusts nothing it has not checked, against hostile inputs and faults: `--plan` binds each
space to its dataset as the pair's sweep will, `replicates: 0` is refused, a resume refuses an edited grid unless
`--force`, a damaged summary.json under --storage costs only its own pair, and a damaged SQLite tracking store is
one line naming it in `results`, `compare` and `sweep`.

Nothing here starts Ray: the step of a command that would is replaced by one that fails the test.
"""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching
from helpers.paths import REPO

from raybench.commands.benchmark import (
    BenchmarkOptions,
    PairRecord,
    PairRunner,
    Running,
    SweepTarget,
    _record_end,
    check_storage,
    finished_status,
    load_records,
    save_records,
)
from raybench.records import PairState, Replicates, Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.sweep.benchmark_file import BenchmarkError, load_benchmark
from raybench.sweep.errors import OptionError

GRIDS = REPO / "raybench" / "grids"


pytestmark = pytest.mark.usefixtures("in_private_dirs")


@pytest.fixture(autouse=True)
def no_cluster_work(monkeypatch):
    """The benchmark's own checks (storage, records, grid) run; its pairs and any sweep would start Ray."""
    from raybench.commands import benchmark
    from raybench.sweep import runner

    fail_on_reaching(monkeypatch, (benchmark, "_run_pairs_on_cluster"), (runner, "run_sweep"))


def write_yaml(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raybench: error: "), result.stderr[-2000:]
    return lines[0]


def grid(name: str = "b", **extra) -> dict:
    return {"name": name, "trials": 2, "replicates": 1, "executor": "function", "smoke": True,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}], **extra}


# ----- --plan binds each pair to its dataset, as the pair's sweep does ------------------------------------
def test_plan_refuses_a_pair_its_sweep_would_refuse_naming_the_space_not_a_set_never_given(capsys):
    """FixMatch reading an unlabeled split digits-shift does not have: valid on its own, refused on the dataset.
    The plan names the space file as the source, and a run of the same file is refused alike, writing nothing."""
    space = yaml.safe_load((REPO / "raybench" / "search_spaces" / "fixmatch.yaml").read_text())
    space["fixed"]["unlabeled_split"] = "train_unlabeled_nope"
    write_yaml(Path("fixmatch_nope.yaml"), space)
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["digits-shift"], "spaces": ["erm", "fixmatch_nope.yaml"]}]))
    for command in (["benchmark", str(path), "--plan"], ["benchmark", str(path), "--storage", "runs"]):
        line = refused_in_one_line(cli(command, capsys))
        assert line.startswith(f"raybench: error: {path}: fixmatch_nope on digits-shift: fixmatch_nope.yaml: "
                               f"unlabeled_split, as the space resolves on digits-shift: expected one of "), line
        assert "--set" not in line and "got 'train_unlabeled_nope'" in line
    assert sorted(p.name for p in Path().iterdir()) == ["bench.yaml", "fixmatch_nope.yaml"]


def test_plan_names_the_files_set_when_the_refused_value_comes_from_it(capsys):
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["digits-shift"], "spaces": ["fixmatch"]}],
                                               set={"unlabeled_split": "nope"}))
    line = refused_in_one_line(cli(["benchmark", str(path), "--plan"], capsys))
    assert line.startswith(f"raybench: error: {path}: fixmatch on digits-shift: set.unlabeled_split: expected one of"), line


def test_the_shipped_digits_grid_plans_with_every_pair_bound(capsys):
    """Nothing real is refused: the WILDS Table 2 grid on digits-shift binds all its eight pairs."""
    result = cli(["benchmark", str(GRIDS / "table2_digits.yaml"), "--plan"], capsys)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sweep table2-") == 8 and "not checked here" not in result.stdout


def test_a_pair_whose_dataset_files_are_not_here_is_planned_and_said_unchecked(capsys, monkeypatch, tmp_path):
    """A WILDS root lives on the cluster: --plan still plans the pair and says its sweep checks it there."""
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(tmp_path / "no-wilds-here"))
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["camelyon17", "digits-shift"], "spaces": ["erm"]}]))
    result = cli(["benchmark", str(path), "--plan"], capsys)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("erm on camelyon17" in line and line.endswith("not checked here (see below)") for line in lines)
    assert not any("erm on digits-shift" in line and "not checked" in line for line in lines)
    assert any(line.startswith("  camelyon17: WILDS root ") for line in lines)


# ----- replicates: 0 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, key", [
    ({"replicates": 0}, "replicates"),
    ({"pairs": [{"dataset": "digits-shift", "space": "erm", "replicates": 0}]}, "pairs[0].replicates"),
])
def test_zero_replicates_is_refused_at_load(change, key):
    """A pair's row in the comparison is the mean over its replicates: with none it would end "finished" with an
    empty table, and `compare` would say no trial or replicate finished, which is false."""
    path = write_yaml(Path("bench.yaml"), grid(**change))
    with pytest.raises(BenchmarkError, match=rf"^{re.escape(str(path))}: {re.escape(key)}: expected an integer >= 1, "
                                             rf"got 0$"):
        load_benchmark(str(path))


# ----- --resume under an edited grid ----------------------------------------------------------------------------
def started_benchmark(path: Path, storage: Path) -> None:
    """The record a benchmark writes when it starts (its pairs waiting), as `run_benchmark` writes it."""
    benchmark = load_benchmark(str(path))
    save_records(storage / benchmark.name / "benchmark.json", benchmark, load_records(Path("none.json"), benchmark))


def resume_options(storage: Path, force: bool = False) -> BenchmarkOptions:
    return BenchmarkOptions(storage.resolve(), "sqlite:///unused.db", resume=True, force=force)


def test_resume_refuses_an_edited_grid_in_one_line_unless_forced(capsys):
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["digits-shift"], "spaces": ["erm", "dann"]}]))
    storage = Path("runs")
    started_benchmark(path, storage)
    assert check_storage(load_benchmark(str(path)), resume_options(storage)) == []  # the same file resumes

    write_yaml(path, grid(trials=3, grid=[{"datasets": ["digits-shift"], "spaces": ["erm", "coral"]}]))
    edited = load_benchmark(str(path))
    with pytest.raises(OptionError) as refused:
        check_storage(edited, resume_options(storage))
    message = str(refused.value)
    assert message.startswith(f"--resume: {path} changed since benchmark 'b' started (pairs added: b-coral-digits-shift; "
                              f"pairs removed: b-dann-digits-shift; b-erm-digits-shift: trials 2 -> 3)"), message
    assert message.endswith("pass --force to go on under this one")
    [warning] = check_storage(edited, resume_options(storage, force=True))
    assert warning.startswith(f"warning: {path} changed since the benchmark started (pairs added") and "--force" in warning

    line = refused_in_one_line(cli(["benchmark", str(path), "--resume", "--storage", "runs"], capsys))
    assert line == f"raybench: error: {message}"
    assert not Path("mlflow.db").exists()


def test_resume_refuses_a_grid_whose_space_file_was_edited():
    space = Path("mine.yaml")
    space.write_text((REPO / "raybench" / "search_spaces" / "erm.yaml").read_text())
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["digits-shift"], "spaces": ["mine.yaml"]}]))
    started_benchmark(path, Path("runs"))
    space.write_text(space.read_text().replace("patience: 4", "patience: 5"))
    with pytest.raises(OptionError, match=r"\(b-mine-digits-shift: its space file was edited\)"):
        check_storage(load_benchmark(str(path)), resume_options(Path("runs")))


def test_force_without_resume_is_one_line(capsys):
    path = write_yaml(Path("bench.yaml"), grid())
    line = refused_in_one_line(cli(["benchmark", str(path), "--force", "--storage", "runs"], capsys))
    assert line.startswith("raybench: error: --force: expected only with --resume"), line
    assert sorted(p.name for p in Path().iterdir()) == ["bench.yaml"]


def test_a_damaged_benchmark_record_is_a_warning_on_resume_and_its_pairs_start_afresh():
    path = write_yaml(Path("bench.yaml"), grid())
    started_benchmark(path, Path("runs"))
    state = Path("runs") / "b" / "benchmark.json"
    state.write_text(state.read_text()[: len(state.read_text()) // 2])
    benchmark = load_benchmark(str(path))
    [warning] = check_storage(benchmark, resume_options(Path("runs")))
    assert warning.startswith(f"warning: {state.resolve()} is damaged: not JSON (")
    assert load_records(state, benchmark) == {"b-erm-digits-shift": PairRecord("b-erm-digits-shift", "digits-shift", "erm")}


# ----- a damaged summary.json under --storage ------------------------------------------------------------------
def finished_summary(name: str) -> dict:
    """A finished sweep of one of grid()'s pairs: its 2 trials (a finished sweep with fewer than its pair's trials
    is one whose benchmark file grew it: it runs again)."""
    return {"name": name, "dataset": "digits-shift", "algorithm": "erm", "state": "finished",
            "selection": {"strategy": "ood_val"},
            "trials": [{"trial_id": "t", "status": "ok", "order": 1}, {"trial_id": "u", "status": "ok", "order": 2}],
            "selected": {"trial_id": "t", "status": "ok"},
            "replicates": {"seeds": [1], "ok": 1, "runs": [], "summary": {}}}


DAMAGE = {
    "cut in half": lambda text: text[: len(text) // 2],
    "a list": lambda text: "[]",
    "an empty mapping": lambda text: "{}",
    "trials not a list": lambda text: json.dumps({**json.loads(text), "trials": "x", "selected": None}),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_summary_is_named_and_only_its_pair_runs_again(damage):
    """The other pair stays finished; the damaged one is named in one line and waits to run again (its sweep's
    --resume rewrites the file): nothing raises, so a finished benchmark is never turned into a FAILED one."""
    path = write_yaml(Path("bench.yaml"), grid(grid=[{"datasets": ["digits-shift"], "spaces": ["erm", "dann"]}]))
    benchmark = load_benchmark(str(path))
    storage = Path("runs").resolve()
    for pair in benchmark.pairs:
        results = storage / pair.sweep / "results"
        results.mkdir(parents=True)
        (results / "summary.json").write_text(json.dumps(finished_summary(pair.sweep)))
    damaged = storage / "b-dann-digits-shift" / "results" / "summary.json"
    damaged.write_text(DAMAGE[damage](damaged.read_text()))

    said: list[str] = []
    records = load_records(Path("none.json"), benchmark)
    runner = PairRunner(benchmark, BenchmarkOptions(storage, "sqlite:///unused.db", resume=True), records,
                        SweepTarget("127.0.0.1:1", "sqlite:///unused.db", "run"), storage / "b" / "benchmark.json",
                        said.append)
    waiting = runner._pending()
    assert [p.sweep for p in waiting] == ["b-dann-digits-shift"]
    assert records["b-erm-digits-shift"].status == "finished" and records["b-dann-digits-shift"].status == "waiting"
    [line] = [s for s in said if "dann" in s]
    assert line.startswith(f"dann on digits-shift: {damaged} is damaged: ") and "\n" not in line
    assert line.endswith("not counted as finished: its sweep runs again (resuming it)")


def test_a_sweep_that_exits_0_leaving_a_damaged_summary_is_failed_naming_the_file(tmp_path):
    path = write_yaml(Path("bench.yaml"), grid())
    [pair] = load_benchmark(str(path)).pairs
    damaged = tmp_path / "runs" / pair.sweep / "results" / "summary.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text("[]")
    done = subprocess.Popen(["true"])
    done.wait()
    record = PairRecord(pair.sweep, pair.dataset, pair.method)
    _record_end(Running(pair, done, time.time(), open(tmp_path / "log", "w")), record, tmp_path / "runs", tmp_path)  # noqa: SIM115  _record_end closes it
    assert (record.status, record.reason) == ("failed", f"{damaged} is damaged: a JSON list, not a mapping")


# ----- a damaged SQLite tracking store ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> Path:
    """A real MLflow SQLite store with raybench's experiment and a few sweeps' parent runs in it."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    experiment = client.create_experiment("raybench")
    for i in range(3):
        run = client.create_run(experiment, tags={"stage": "sweep", "raybench.sweep": f"s{i}"})
        for step in range(20):
            client.log_metric(run.info.run_id, "m", step, step=step)
    return path


def random_bytes(good: Path, bad: Path) -> None:
    bad.write_bytes(bytes(range(256)) * 200)


def truncated(good: Path, bad: Path) -> None:
    bad.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])


def damaged_pages(good: Path, bad: Path) -> None:
    """The store's first page (its schema) intact, the pages holding the runs and experiments tables overwritten:
    a check that reads the schema alone passes it, and MLflow's first query fails."""
    shutil.copy(good, bad)
    with sqlite3.connect(good) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        roots = [page for (page,) in db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name IN ('runs', 'experiments', 'alembic_version')")]
    with open(bad, "r+b") as handle:
        for page in roots:
            handle.seek((page - 1) * size)
            handle.write(b"\xff" * size)


@pytest.mark.parametrize("damage", [random_bytes, truncated, damaged_pages], ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", [["results", "s1"], ["compare"], ["sweep", "erm", "--smoke", "--storage", "runs"]],
                         ids=lambda c: c[0])
def test_a_damaged_tracking_store_is_one_line_naming_it(command, damage, mlflow_store, capsys):
    store = Path("mlflow.db").resolve()
    damage(mlflow_store, store)
    before = store.read_bytes()
    line = refused_in_one_line(cli([*command, "--tracking-uri", f"sqlite:///{store}"], capsys))
    assert f"'{store}'" in line and ("damaged" in line or "not a readable SQLite database" in line), line
    assert store.read_bytes() == before and sorted(p.name for p in Path().iterdir()) == ["mlflow.db"]


def test_a_pair_whose_sweep_selected_nothing_fails_naming_why_its_trials_failed():
    trials = [TrialRecord(order=i, trial_id=f"t{i}", seed=0, status=status, sampled={}, failure_reason=reason)
              for i, (status, reason) in enumerate([(TrialStatus.FAILED, "RuntimeError: loss is nan"),
                                                    (TrialStatus.FAILED, "OSError: no space left"),
                                                    (TrialStatus.INTERRUPTED, "")])]
    summary = SweepSummary(name="s", dataset="digits-shift", algorithm="erm", state=SweepState.FINISHED,
                           selection=Selection("ood_val", "val/acc", "OOD val"), trials=trials, replicates=Replicates())
    assert finished_status(summary) == (
        PairState.FAILED, "no trial finished (OSError: no space left; RuntimeError: loss is nan; interrupted)")
    assert finished_status(replace(summary, state=SweepState.INTERRUPTED)) is None
