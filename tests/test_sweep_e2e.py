"""End to end on a real local Ray with a real MLflow store: a smoke sweep, failure isolation, results.

Each sweep runs as the `raybench` command in a subprocess that joins the session's Ray head, exactly as a user
runs it on a cluster; the test then reads what it left in MLflow through MlflowClient.
"""
from __future__ import annotations

import io
import json
import math
import re
import statistics
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
import pytest
from helpers.cli import cli, on_head, run_cli
from helpers.mlflow_stores import seeded_store
from helpers.paths import BIN
from mlflow.tracking import MlflowClient
from ray.tune.result import AUTO_RESULT_KEYS

from raybench.data import load_dataset
from raybench.report_keys import CLOCK_STAMPS, SCHEMA_VERSION, SUMMARY_SCHEMA
from raybench.sweep.space import load_space
from raybench.tracking import mlflow_metric_name

SEED = 3


# search.png's panels, each also its own PNG: one per hyperparameter dann.yaml searches
DANN_PANELS = ("search-classifier_lr.png", "search-discriminator_lr.png", "search-unlabeled_ratio.png",
               "search-penalty.png")


@dataclass
class LineSeen:
    """A line of the sweep's output and what its --storage held the moment the test read it."""

    text: str
    tune_started: bool  # the search's Tune experiment folder exists
    trials_ended: int  # completed-run records of the search


def stream_sweep(args: list[str], env: dict, cwd: Path, storage: Path) -> tuple[int, list[LineSeen], str]:
    """Run `raybench ARGS`, reading its stdout line by line as it runs, and note beside each line whether Tune had
    started and how many search trials had ended by then; (exit status, the lines, stderr)."""
    process = subprocess.Popen([str(BIN / "raybench"), *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)
    reader.start()
    search = storage / "smoke-search"
    seen = []
    for line in process.stdout:
        ended = len(list((search / "completed").glob("*.json"))) if (search / "completed").is_dir() else 0
        seen.append(LineSeen(line.rstrip("\n"), search.exists(), ended))
    code = process.wait(timeout=600)
    reader.join(timeout=60)
    return code, seen, "".join(errors)


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory, ray_head, empty_store):
    """One smoke sweep of DANN through the Ray Train executor (2 trials x 4 steps x 2 epochs, 2 replicates), on
    the session's Ray head as a sweep on a cluster runs; its output read as it runs."""
    workdir = tmp_path_factory.mktemp("sweep")
    env = dict(ray_head.env)
    uri = seeded_store(empty_store, workdir / "mlflow.db")
    code, seen, stderr = stream_sweep(on_head(["sweep", "dann", "--smoke", "--seed", str(SEED), "--name", "smoke",
                                               "--storage", str(workdir / "runs"), "--tracking-uri", uri], ray_head),
                                      env, workdir, workdir / "runs")
    assert code == 0, stderr[-4000:]
    summary = json.loads((workdir / "runs" / "smoke" / "results" / "summary.json").read_text())
    stdout = "\n".join(line.text for line in seen)
    return {"dir": workdir, "uri": uri, "stdout": stdout, "seen": seen, "summary": summary, "env": env}


def replay_random_sampler(space_name: str, seed: int, n: int, data_dir: Path) -> list[dict]:
    """What Optuna's RandomSampler(seed) draws for the space's distributions, in order."""
    from raybench.sweep.sampling import optuna_distribution

    resolved = load_space(space_name).for_dataset(load_dataset("digits-shift", data_dir))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    distributions = {name: optuna_distribution(p) for name, p in resolved.search.items()}
    return [study.ask(distributions).params for _ in range(n)]


def test_same_seed_gives_the_same_configs(smoke_sweep, shared_data_dir):
    trials = smoke_sweep["summary"]["trials"]
    assert len(trials) == 2 and [t["order"] for t in trials] == sorted(t["order"] for t in trials)
    expected = replay_random_sampler("dann", SEED, 2, shared_data_dir)
    for trial, params in zip(trials, expected):
        assert trial["sampled"] == pytest.approx(params)


def test_space_draw_shows_exactly_the_configs_the_sweep_ran(smoke_sweep, capsys):
    drawn = cli(["space", "draw", "dann", "--smoke", "--seed", str(SEED), "--trials", "2", "--format", "json"], capsys)
    assert drawn.returncode == 0, drawn.stderr
    ran = sorted(smoke_sweep["summary"]["trials"], key=lambda t: t["order"])
    assert [t["sampled"] for t in json.loads(drawn.stdout)] == [t["sampled"] for t in ran]  # exactly, not approx


def test_selected_trial_has_the_maximum_ood_val_metric(smoke_sweep):
    summary = smoke_sweep["summary"]
    ok = [t for t in summary["trials"] if t["status"] == "ok"]
    assert summary["selection"]["metric"] == "val/acc"
    assert summary["selected"]["selection_value"] == max(t["selection_value"] for t in ok)
    for t in ok:
        assert t["selection_value"] == pytest.approx(t["metrics"]["best/val/acc"])


def test_replicate_count_and_summary_math(smoke_sweep):
    assert smoke_sweep["summary"][SCHEMA_VERSION] == SUMMARY_SCHEMA
    rep = smoke_sweep["summary"]["replicates"]
    assert len(rep["seeds"]) == len(set(rep["seeds"])) == 2 and rep["ok"] == 2
    assert sorted(r["seed"] for r in rep["runs"]) == sorted(rep["seeds"])
    for key in ("best/test/acc", "best/id_test/acc", "best/val/acc"):
        values = [r["metrics"][key] for r in rep["runs"]]
        assert rep["summary"][key]["mean"] == pytest.approx(statistics.mean(values))
        assert rep["summary"][key]["std"] == pytest.approx(statistics.stdev(values))
        assert rep["summary"][key]["n"] == 2


def test_mlflow_has_one_parent_with_nested_trials_and_replicates(smoke_sweep):
    client = MlflowClient(tracking_uri=smoke_sweep["uri"])
    experiment = client.get_experiment_by_name("raybench")
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    stages = sorted(r.data.tags["stage"] for r in children)
    assert stages == ["replicate", "replicate", "search", "search"]
    for run in children:
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert {"trial_id", "seed", "dataset", "algorithm", "raybench_version"} <= set(tags)
        assert tags["dataset"] == "digits-shift" and tags["algorithm"] == "dann"
        assert "penalty" in run.data.params and "unlabeled_ratio" in run.data.params
        history = client.get_metric_history(run.info.run_id, "ood_val/acc")
        assert sorted(m.step for m in history) == [0, 1]  # one value per epoch
        short = tags["trial_id"][:8]  # readable names: the searched values, or the replicate's seed
        expected = (f"replicate {short}: seed {tags['seed']}" if tags["stage"] == "replicate" else
                    f"search {short}: classifier_lr={float(run.data.params['classifier_lr']):.3g}, ")
        assert run.info.run_name.startswith(expected), run.info.run_name
    trial_ids = {r.data.tags["trial_id"] for r in children if r.data.tags["stage"] == "search"}
    assert trial_ids == {t["trial_id"] for t in smoke_sweep["summary"]["trials"]}
    artifacts = {a.path for a in client.list_artifacts(parent, "results")}
    assert {"results/summary.json", "results/trials.csv", "results/trials.parquet", "results/replicates.parquet"} <= artifacts
    assert [a.path for a in client.list_artifacts(parent, "selected_checkpoint")] == ["selected_checkpoint/best_model.pt"]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs
    assert {a.path for a in client.list_artifacts(parent, "plots")} == {
        "plots/search.png", "plots/curves.png", "plots/id_vs_ood.png", *(f"plots/{name}" for name in DANN_PANELS)}
    description = parents[0].data.tags["mlflow.note.content"]
    assert f"Selected trial `{smoke_sweep['summary']['selected']['trial_id']}`" in description


RESULTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "results.md"


def documented_table(after: str) -> list[list[str]]:
    """The rows (header and rule left out) of the first table after the text `after` in
    docs/reference/results.md, cells split on `|`."""
    rows: list[str] = []
    for line in RESULTS_PAGE.read_text().split(after, 1)[1].splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows[2:]]


def pattern_of(template: str) -> re.Pattern:
    """A documented name (`search <trial id>: <setting>=<value>, ...`, `best/ood_val/<metric>`) as a regex: each
    <placeholder> stands for any text, `...` for the rest of the name."""
    parts = re.split(r"(<[^>]+>|\.\.\.)", template)
    return re.compile("".join(".+" if part.startswith("<") or part == "..." else re.escape(part) for part in parts) + "$")


def documented_names(cell: str) -> list[re.Pattern]:
    """Every backticked name in a table cell; `.../std` after a name repeats that name's prefix."""
    names = re.findall(r"`([^`]+)`", cell)
    return [pattern_of(name if not name.startswith(".../") else names[0].rsplit("/", 1)[0] + name[3:]) for name in names]


def test_the_stores_run_names_metric_names_and_files_are_the_ones_the_docs_name(smoke_sweep):
    """docs/reference/results.md's tables, read as data, against the smoke sweep's real store and folders: every
    run name and every metric name in MLflow is one the page documents, and the files it says a sweep writes are
    where it says."""
    client = MlflowClient(tracking_uri=smoke_sweep["uri"])
    experiment = client.get_experiment_by_name("raybench")
    runs = client.search_runs([experiment.experiment_id])
    run_names = {row[0]: documented_names(row[1])[0] for row in documented_table("### Run names in MLflow")}
    kind_of_stage = {"sweep": "a sweep", "search": "a search trial", "replicate": "a replicate"}
    metric_names = [p for after in ("### Metric names in MLflow", "On the sweep's parent run, once")
                    for row in documented_table(after) for p in documented_names(row[0])]
    for run in runs:
        documented = run_names[kind_of_stage[run.data.tags["stage"]]]
        assert documented.match(run.info.run_name), f"{run.info.run_name!r} is not named {documented.pattern!r}"
        for key in run.data.metrics:
            assert any(p.match(key) for p in metric_names), f"undocumented metric {key!r} on {run.info.run_name!r}"
    assert [r.info.run_name for r in runs if r.data.tags["stage"] == "sweep"] == ["smoke"]
    assert {"search", "replicate", "sweep"} <= {r.data.tags["stage"] for r in runs}
    results = smoke_sweep["dir"] / "runs" / "smoke" / "results"
    for name in ("summary.json", "summary.md", "trials.csv", "trials.parquet", "replicates.csv", "replicates.parquet"):
        assert (results / name).is_file(), name
    assert (smoke_sweep["dir"] / "runs" / "smoke" / "plots" / "search.png").is_file()
    assert (smoke_sweep["dir"] / "runs" / "smoke-search").is_dir()
    selected = smoke_sweep["summary"]["selected"]["trial_id"]
    assert (smoke_sweep["dir"] / "runs" / f"smoke-replicate-{selected}").is_dir()


def test_auto_replicates_add_seeds_against_the_baseline_sweep_until_the_rule_stops(smoke_sweep, ray_head, tmp_path):
    """`--replicates auto --baseline smoke --replicates-cap 3` on a real sweep: the first look's 2 seeds (the
    smoke count), then one more only if Welch's test at alpha / looks has not told the two apart; the summary
    records the rule and the results page says how it ended. On a copy of the smoke sweep's store, which the
    module's other tests read as holding that one sweep."""
    import shutil

    from raybench.sweep.outcome import replicate_seeds, replicate_values
    from raybench.sweep.seed_rules import SequentialRule

    workdir, storage = tmp_path, tmp_path / "runs"
    shutil.copy(smoke_sweep["dir"] / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # The copy's smoke sweep names the module's own storage, which its other tests read as it is: without the
    # command that resumes it, the rule takes its replicates as recorded instead of adding seeds to it there
    # (the baseline grown: tests/test_search_growth.py)
    copied = MlflowClient(tracking_uri=uri)
    [baseline_run] = copied.search_runs([e.experiment_id for e in copied.search_experiments()],
                                        "tags.`raybench.sweep` = 'smoke' and tags.stage = 'sweep'")
    copied.delete_tag(baseline_run.info.run_id, "raybench.resume_command")
    done = run_cli(on_head(["sweep", "dann", "--smoke", "--seed", str(SEED + 1), "--name", "auto", "--storage",
                            str(storage), "--tracking-uri", uri, "--replicates", "auto",
                            "--replicates-cap", "3", "--baseline", "smoke"], ray_head), smoke_sweep["env"], workdir)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((storage / "auto" / "results" / "summary.json").read_text())
    record = summary["report"]["replicate_rule"]
    selected = summary["selected"]["trial_id"]
    seeds = summary["replicates"]["seeds"]
    assert seeds == replicate_seeds(selected, len(seeds)) and len(seeds) in (2, 3)
    from raybench.records import SweepSummary

    mine, baseline = (SweepSummary.from_json(s) for s in (summary, smoke_sweep["summary"]))
    values = replicate_values(mine.replicates.runs, record["column"])
    decided = SequentialRule(2, 3).decided(values[:2], replicate_values(baseline.replicates.runs, record["column"]))
    assert len(seeds) == (2 if decided else 3)  # a second look exactly when the first did not decide
    assert (storage / f"auto-replicate-{selected}-to3").is_dir() == (len(seeds) == 3)
    assert record["baseline"] == "smoke" and record["replicates"] == len(seeds) and record["cap"] == 3
    assert record["baseline_grown"] is False and "no `raybench sweep` command" in record["baseline_not_grown"]
    assert record["baseline_replicates"] == len(smoke_sweep["summary"]["replicates"]["runs"])
    shown = run_cli(["results", "auto", "--tracking-uri", uri], smoke_sweep["env"], workdir)
    assert f"Replicates: {len(seeds)}, " in shown.stdout and "against smoke on test/acc" in shown.stdout


def tune_reports(stage_dir: Path) -> dict[str, list[dict]]:
    """What each Tune trial of a stage reported, epoch by epoch, as Tune itself kept it (its result.json lines,
    written by Tune's own JSON logger, not by raybench), by Tune trial id."""
    reports: dict[str, list[dict]] = {}
    for path in stage_dir.glob("*/result.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        reports[rows[0]["trial_id"]] = rows
    return reports


def reported_numbers(row: dict) -> dict[str, float]:
    """The finite numbers the training loop put in one report: not the bookkeeping Tune adds to every result
    (iteration counts, its clock, the pid), nor strings, flags, the nested config or Nones."""
    from ray.tune.result import AUTO_RESULT_KEYS

    return {key: float(value) for key, value in row.items() if key not in AUTO_RESULT_KEYS
            and key not in CLOCK_STAMPS and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def test_every_number_each_trial_reported_is_in_its_mlflow_run_at_its_epoch(smoke_sweep):
    """What the training loop reported to Tune and what MLflow holds, key by key and epoch by epoch: the writer
    sends a report of some fifty numbers in one log_batch, so a batch that lost any of them, or a step, would
    pass every check that only looks at a few keys (val/acc, the summary's best values)."""
    client = MlflowClient(tracking_uri=smoke_sweep["uri"])
    experiment = client.get_experiment_by_name("raybench")
    runs = [run for run in client.search_runs([experiment.experiment_id], "")
            if run.data.tags.get("stage") in ("search", "replicate")]
    reports = {**tune_reports(smoke_sweep["dir"] / "runs" / "smoke-search"),
               **{trial: rows for stage in (smoke_sweep["dir"] / "runs").glob("smoke-replicate-*")
                  for trial, rows in tune_reports(stage).items()}}
    assert len(runs) == 4 and {run.data.tags["tune_trial_id"] for run in runs} == set(reports)
    for run in runs:
        rows = reports[run.data.tags["tune_trial_id"]]
        assert [int(row["epoch"]) for row in rows] == [0, 1], "a smoke trial reports two epochs"
        stored: dict[str, set[tuple[int, float]]] = {}
        for key in {key for row in rows for key in reported_numbers(row)}:
            history = client.get_metric_history(run.info.run_id, mlflow_metric_name(key))  # MLflow's name of it
            stored[key] = {(m.step, m.value) for m in history}
        assert len(stored) > 30, f"only {len(stored)} numbers a report: not a real trial's report"
        missing = [(key, int(row["epoch"]), value) for row in rows for key, value in reported_numbers(row).items()
                   if (int(row["epoch"]), value) not in stored[key]]
        assert not missing, f"run {run.info.run_name}: reported but not in MLflow (key, step, value): {missing[:10]}"
        bookkeeping = set(run.data.metrics) & (set(AUTO_RESULT_KEYS) | CLOCK_STAMPS)
        assert not bookkeeping, f"run {run.info.run_name}: Tune's or the clock's bookkeeping as metrics: {bookkeeping}"
    parent = client.get_run(smoke_sweep["summary"]["mlflow"]["run_id"])
    stamps = [key for key in parent.data.metrics if any(stamp in key for stamp in CLOCK_STAMPS)]
    assert stamps == [], f"the parent run averages wall-clock moments over replicates: {stamps}"


def test_the_selected_checkpoint_rebuilds_and_scores_its_logged_test_accuracy(smoke_sweep, shared_data_dir, tmp_path):
    """The selected trial's model, from the sweep's MLflow run alone (the Python API's loader): rebuilt from its
    record, scored on the OOD test split, it gives the test accuracy the trial logged at its best epoch (the epoch
    its weights are from)."""
    from raybench import api

    model, record = api.load_model("smoke", tracking_uri=smoke_sweep["uri"], destination=tmp_path / "selected")
    assert sorted(p.name for p in (tmp_path / "selected").iterdir()) == ["best_model.pt"]
    selected = smoke_sweep["summary"]["selected"]
    assert (record.dataset, record.algorithm, record.model) == ("digits-shift", "dann", "lenet")
    assert record.epoch == selected["best_epoch"] and record.settings["seed"] == selected["seed"]
    scored = api.evaluate(model, record, "test", data_dir=shared_data_dir)
    assert scored["test/acc"] == pytest.approx(selected["metrics"]["best/test/acc"], abs=1e-6)
    # A smoke trial is near chance, so its macro F1 (which sees every class's hits) pins the model down too.
    assert scored["test/macro_f1"] == pytest.approx(selected["metrics"]["best/test/macro_f1"], abs=1e-6)


def test_results_command_reads_the_sweep_back(smoke_sweep, capsys):
    workdir, uri = smoke_sweep["dir"], smoke_sweep["uri"]
    as_json = cli(["results", "smoke", "--format", "json", "--tracking-uri", uri], capsys)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["selected"]["trial_id"] == smoke_sweep["summary"]["selected"]["trial_id"]
    assert set(data) >= {"name", "dataset", "algorithm", "selection", "trials", "selected", "replicates"}
    table = cli(["results", "smoke", "--tracking-uri", uri], capsys)
    assert "OOD test" in table.stdout and "ID test" in table.stdout and data["selected"]["trial_id"] in table.stdout
    csv = cli(["results", "smoke", "--format", "csv", "--tracking-uri", uri], capsys)
    assert csv.stdout.splitlines()[0].startswith("trial_id,status,selection_value") and len(csv.stdout.splitlines()) == 3
    figures = cli(["results", "smoke", "--plots", str(workdir / "figures"), "--tracking-uri", uri], capsys)
    assert figures.returncode == 0, figures.stderr
    assert sorted(p.name for p in (workdir / "figures").iterdir()) == sorted(
        ["curves.png", "id_vs_ood.png", "search.png", *DANN_PANELS])
    missing = cli(["results", "nope", "--tracking-uri", uri], capsys)
    assert missing.returncode == 2 and "no sweep named 'nope'" in missing.stderr


def test_every_run_reports_its_timing_and_its_parts_add_up(smoke_sweep):
    summary = smoke_sweep["summary"]
    for run in summary["trials"] + summary["replicates"]["runs"]:
        m = run["metrics"]
        assert m["time/startup_s"] > 0 and m["time/trial_s"] > 0 and m["time/teardown_s"] >= 0
        assert m["time/cpu_s"] > 0 and m["time/gpu_s"] == 0  # CPU workers hold no GPU
        parts = m["time/startup_s"] + m["time/trial_s"] + m["time/teardown_s"]
        assert parts == pytest.approx(m["time/wall_s"], abs=0.5)


def test_compute_totals_are_the_sums_over_runs_in_the_summary_mlflow_and_results(smoke_sweep, capsys):
    summary, client = smoke_sweep["summary"], MlflowClient(tracking_uri=smoke_sweep["uri"])
    stages = {"search": summary["trials"], "replicates": summary["replicates"]["runs"]}
    experiment = client.get_experiment_by_name("raybench")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")
    for stage, runs in stages.items():
        totals = summary["compute"][stage]
        assert totals["runs"] == len(runs) == 2
        for name in ("wall_s", "cpu_s", "gpu_s"):
            assert totals[name] == pytest.approx(sum(r["metrics"][f"time/{name}"] for r in runs))
            assert parent.data.metrics[f"compute/{stage}/{name}"] == pytest.approx(totals[name])
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert all(run.data.metrics["time/wall_s"] > run.data.metrics["time/trial_s"] for run in children)
    shown = cli(["results", "smoke", "--tracking-uri", smoke_sweep["uri"]], capsys)
    assert "Compute: search 2 runs" in shown.stdout and "replicates 2 runs" in shown.stdout


def test_the_phases_are_named_as_they_begin_and_0_of_n_comes_before_any_trial_ends(smoke_sweep):
    """Read as the sweep ran: its first line came before it joined Ray and before Tune started, each phase is
    named in the order it ran, and the search's `0/2` came while no trial had ended; piped, no escape code."""
    seen = smoke_sweep["seen"]
    first = seen[0]
    assert first.text == "sweep smoke: checking the search space, the dataset and the flags"
    assert not first.tune_started
    texts = [line.text for line in seen]
    phases = ["sweep smoke: checking", "dataset digits-shift: loading", "dataset digits-shift: ready in ",
              "Ray: joining the cluster at 127.0.0.1:", "Ray: ready in ", "search: 0/2 done",
              "replicates: 2 seeds of trial", "replicates: 0/2 done", "results: writing the summary"]
    where = [next(i for i, text in enumerate(texts) if text.startswith(phase)) for phase in phases]
    assert where == sorted(where), f"phases out of order: {texts[:12]}"
    zero = seen[where[phases.index("search: 0/2 done")]]
    assert zero.tune_started and zero.trials_ended == 0, "0/2 came after a trial ended"
    assert not any(seen[i].tune_started for i in where[:phases.index("Ray: ready in ")]), "a phase line came late"
    assert all("\x1b" not in text for text in texts), "an escape code in piped output"


def test_the_console_shows_one_progress_line_per_run_and_none_of_tunes_boxes(smoke_sweep):
    summary, stdout = smoke_sweep["summary"], smoke_sweep["stdout"]
    progress = re.compile(r"^(search|replicates): (\d+/\d+ done,|\d+ seeds of trial )")
    firsts: dict[str, str] = {}  # each count's first line: an interval line repeats the count before it
    for line in stdout.splitlines():
        if progress.match(line):
            firsts.setdefault(line.split(",")[0], line)
    lines, heads = list(firsts.values()), list(firsts)
    selected = summary["selected"]
    assert heads == ["search: 0/2 done", "search: 1/2 done", "search: 2/2 done",
                     f"replicates: 2 seeds of trial {selected['trial_id']} (best of the search",
                     "replicates: 0/2 done", "replicates: 1/2 done", "replicates: 2/2 done"]
    assert f"best OOD val acc {selected['selection_value']:.4f}" in lines[2] and lines[2].endswith("ETA 0s")
    assert "Configuration for experiment" not in stdout and "TensorBoard" not in stdout
    assert "wall time" in stdout and "Compute: search 2 runs" in stdout
    assert "hyperparameter importance for val/acc: fANOVA" in stdout  # the closing table is `results`'s


def test_compare_shows_each_sweeps_own_results_in_every_format(smoke_sweep, tmp_path, ray_head, capsys):
    """A second smoke sweep (ERM, function trials) beside the DANN one, in a copy of its store; `compare` must
    give each sweep's own `results` numbers in every format, and draw the figure."""
    import shutil

    from pylatexenc.latexwalker import LatexWalker

    from raybench.report.results import fmt

    shutil.copy(smoke_sweep["dir"] / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    second = run_cli(on_head(["sweep", "erm", "--smoke", "--executor", "function", "--max-concurrent", "1", "--name", "smoke-erm", "--storage",
                              str(tmp_path / "runs"), "--tracking-uri", uri], ray_head), ray_head.env, tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    own = {name: json.loads(cli(["results", name, "--format", "json", "--tracking-uri", uri], capsys).stdout)["replicates"]["summary"] for name in ("smoke", "smoke-erm")}

    def compared(fmt_name: str, *extra: str) -> str:
        proc = cli(["compare", "--format", fmt_name, "--tracking-uri", uri, *extra], capsys)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    data = json.loads(compared("json"))
    assert [r["sweep"] for r in data["rows"]] == ["smoke", "smoke-erm"] and data["unfinished"] == []
    keys = [c["key"] for c in data["tables"][0]["columns"]]
    assert keys == ["id_test/acc", "test/acc"]
    frame = pd.read_csv(io.StringIO(compared("csv")))
    for row, (_, csv_row) in zip(data["rows"], frame.iterrows()):
        for key in keys:
            cell = own[row["sweep"]][f"best/{key}"]
            assert (row[f"{key}.mean"], row[f"{key}.n"]) == (cell["mean"], cell["n"])
            assert row[f"{key}.std"] == cell["std"] and csv_row[f"{key}.mean"] == pytest.approx(cell["mean"], rel=1e-12)
    texts = {fmt_name: compared(fmt_name) for fmt_name in ("table", "markdown", "latex")}
    for cells in own.values():
        for key in keys:
            shown = fmt(cells[f"best/{key}"])
            assert shown in texts["table"] and shown in texts["markdown"]
            assert shown.replace(" ± ", " $\\pm$ ") in texts["latex"]
    LatexWalker(texts["latex"], tolerant_parsing=False).get_latex_nodes()
    assert [r["sweep"] for r in json.loads(compared("json", "--sweeps", "smoke-erm,smoke"))["rows"]] == ["smoke-erm", "smoke"]
    assert [r["sweep"] for r in json.loads(compared("json", "--algorithms", "erm"))["rows"]] == ["smoke-erm"]
    compared("table", "--plot", str(tmp_path / "figures" / "compare.png"))
    assert (tmp_path / "figures" / "compare.png").stat().st_size > 10_000
    missing = cli(["compare", "--sweeps", "nope", "--tracking-uri", uri], capsys)
    assert missing.returncode == 2 and missing.stderr.strip() == "raybench: error: compare: no sweep named 'nope' in the tracking store"


def test_a_diverging_trial_is_recorded_and_the_sweep_goes_on(store_uri, tmp_path, ray_head, shared_data_dir):
    space = tmp_path / "diverge.yaml"
    # plain SGD with a weight decay of 1000: at lr 10 (the largest a setting accepts) every step multiplies the
    # weights by about -1e4, so the loss overflows within a few steps; at lr 0.001 it trains
    space.write_text("algorithm: erm\nsearch:\n  lr: {distribution: choice, values: [0.001, 10.0]}\n"
                     "fixed:\n  optimizer: sgd\n  weight_decay: 1000.0\n")
    resolved = load_space(str(space)).for_dataset(load_dataset("digits-shift", shared_data_dir))
    seed = next(s for s in range(100) if {p["lr"] for p in _replay(resolved, s, 2)} == {0.001, 10.0})
    uri = store_uri
    proc = run_cli(on_head(["sweep", str(space), "--smoke", "--seed", str(seed), "--replicates", "0", "--name", "nan",
                            "--workers-per-trial", "2",  # DDP under Ray Train: all ranks must stop together
                            "--storage", str(tmp_path / "runs"), "--tracking-uri", uri], ray_head), ray_head.env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "nan" / "results" / "summary.json").read_text())
    by_lr = {t["sampled"]["lr"]: t for t in summary["trials"]}
    assert by_lr[10.0]["status"] == "failed" and "loss is nan" in by_lr[10.0]["failure_reason"]
    assert by_lr[0.001]["status"] == "ok"
    assert summary["selected"]["sampled"]["lr"] == 0.001
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    failed = client.search_runs([experiment.experiment_id], "tags.stage = 'search' and attributes.status = 'FAILED'")
    assert len(failed) == 1 and "loss is nan" in failed[0].data.tags["failure_reason"]


def _replay(resolved, seed: int, n: int) -> list[dict]:
    from raybench.sweep.sampling import optuna_distribution

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [study.ask({k: optuna_distribution(p) for k, p in resolved.search.items()}).params for _ in range(n)]


def test_unreachable_tracking_server_fails_fast(tmp_path, sweep_env):
    proc = run_cli(["sweep", "erm", "--smoke", "--tracking-uri", "http://127.0.0.1:9", "--storage", str(tmp_path / "runs")],
                   sweep_env, tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("raybench: error: --tracking-uri: MLflow server at http://127.0.0.1:9 is unreachable")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
