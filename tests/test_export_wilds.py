"""`raybench export wilds`: finished sweeps as the WILDS leaderboard's files, read back as the authors read them.

The leaderboard's reader is the authors' examples/evaluate.py (p-lambda/wilds 4726775); its reading and scoring are
copied here (`authors_read`, `authors_score`, `authors_aggregate`), not taken from raybench, so a file raybench
writes is judged by that logic and not by raybench's own reader. Every dataset's encoding is checked on its exact-
format fixture (tests/wilds_fixtures): the file, read back, scores as the trainer logs the same outputs. One real
sweep (ogb-molpcba: its rows are 128 logits, so a row out of place shows) is exported end to end. The refusals
are checked on sweeps' records written for them, and must come before any model or data is loaded.
"""
from __future__ import annotations

import ast
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli import cli, fail_on_reaching, run_cli
from helpers.paths import REPO

from raybench.commands import export_wilds
from raybench.commands.export_wilds import ExportRequest, Replicate, SweepPlan, find_checkpoint, plan_export
from raybench.data import load_dataset
from raybench.exits import UsageError
from raybench.records import Replicates, Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.report import wilds_files
from raybench.report.wilds_files import BOARDS

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.wilds_fixtures import write_all

NAMES = sorted(BOARDS)


@pytest.fixture(scope="module")
def wilds_root(tmp_path_factory) -> Path:
    """All eight fixtures; camelyon17 without its unlabeled folder, whose class asserts full-size row counts."""
    root = write_all(tmp_path_factory.mktemp("wilds"))
    shutil.rmtree(root / "camelyon17_unlabeled_v1.0")
    return root


@pytest.fixture
def wilds_env(wilds_root, monkeypatch) -> Path:
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(wilds_root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return wilds_root


# ----- the authors' reading, scoring and aggregating (examples/evaluate.py), copied ------------------------------
def authors_read(path: Path):
    """evaluate.py:217-245: a .pth through torch.load, a CSV's non-empty lines through ast.literal_eval."""
    if path.suffix == ".pth":
        return torch.load(path, weights_only=True)
    lines = path.read_text().splitlines()
    return torch.from_numpy(np.array([ast.literal_eval(line.rstrip()) for line in lines if line.rstrip()]))


def authors_score(dataset, split: str, predicted, detection: bool) -> dict:
    """evaluate.py:194-224 `evaluate_replicate` and `evaluate_replicate_for_globalwheat`."""
    subset = dataset.get_subset(split)
    if detection:
        return dataset.eval(predicted, [subset.dataset.y_array[idx] for idx in subset.indices], subset.metadata_array)[0]
    if predicted.shape != subset.y_array.shape:
        predicted.unsqueeze_(-1)
    return dataset.eval(predicted, subset.y_array, subset.metadata_array)[0]


def authors_aggregate(scores: list[dict], splits, metrics) -> dict:
    """evaluate.py:174-184: per split and metric, np.std(ddof=1) then np.mean over the replicates."""
    return {split: {key: value for metric in metrics for key, value in (
        (f"{metric}_std", np.std([s[split][metric] for s in scores], ddof=1)),
        (metric, np.mean([s[split][metric] for s in scores])))} for split in splits}


# ----- names, splits and encodings -------------------------------------------------------------------------------
def test_files_are_named_as_the_leaderboard_names_them():
    assert BOARDS["camelyon17"].file_name("id_val", "seed:0") == "camelyon17_split:id_val_seed:0_epoch:best_pred.csv"
    assert BOARDS["poverty"].file_name("test", "fold:A") == "poverty_split:test_fold:A_epoch:best_pred.csv"
    assert BOARDS["globalwheat"].file_name("val", "seed:2") == "globalwheat_split:val_seed:2_epoch:best_pred.pth"
    assert BOARDS["ogb-molpcba"].file_name("test", "seed:1") == "ogb-molpcba_split:test_seed:1_epoch:best_pred.csv"
    # evaluate.py:72-82: the replicates it reads, and :97-119 the metrics it aggregates, in order
    assert BOARDS["camelyon17"].replicates == tuple(f"seed:{s}" for s in range(10))
    assert BOARDS["civilcomments"].replicates == tuple(f"seed:{s}" for s in range(5))
    assert BOARDS["poverty"].replicates == ("fold:A", "fold:B", "fold:C", "fold:D", "fold:E")
    assert {name: len(board.replicates) for name, board in BOARDS.items() if name not in (
        "camelyon17", "civilcomments", "poverty")} == dict.fromkeys(("amazon", "fmow", "globalwheat", "iwildcam",
                                                                     "ogb-molpcba"), 3)
    assert BOARDS["amazon"].metrics == ("10th_percentile_acc", "acc_avg")
    assert BOARDS["poverty"].metrics == ("r_wg", "r_all")
    assert wilds_files.results_name("iwildcam") == "iwildcam_results.json"


@pytest.mark.parametrize("name", NAMES)
def test_the_leaderboards_splits_are_the_wilds_datasets_own(name, wilds_env):
    """evaluate.py:130-132: every split of the dataset's split_dict but train, in its order."""
    from raybench.data.wilds.adapter import load_wilds

    dataset = load_wilds(name, wilds_env, unlabeled=False)
    assert BOARDS[name].splits == tuple(split for split in dataset.split_dict if split != "train")


def synthetic_outputs(dataset, split: str, generator: torch.Generator):
    """Outputs as a model gives them to the trainer's evaluation: logits, one value, or detections per image."""
    n = len(dataset.split(split))
    if dataset.task.kind.value != "detection":
        return torch.randn(n, dataset.task.n_outputs, generator=generator)
    records = []
    for _ in range(n):
        k = int(torch.randint(0, 4, (1,), generator=generator))
        corner = torch.rand(k, 2, generator=generator) * 24
        records.append({"boxes": torch.cat([corner, corner + 1 + torch.rand(k, 2, generator=generator) * 8], 1),
                        "labels": torch.ones(k, dtype=torch.int64), "scores": torch.rand(k, generator=generator)})
    return records


@pytest.mark.parametrize("name", NAMES)
def test_each_datasets_file_reads_back_to_the_scores_the_trainer_logs(name, wilds_env, tmp_path):
    """The same outputs, written in the leaderboard's encoding and read back as evaluate.py reads them, score as
    raybench's evaluation scores them every epoch: one row per example of the wilds subset, in its order."""
    board, dataset = BOARDS[name], load_dataset(name)
    generator = torch.Generator().manual_seed(7)
    for split in board.splits:
        outputs = synthetic_outputs(dataset, split, generator)
        path = tmp_path / board.file_name(split, "seed:0")
        wilds_files.write_predictions(path, wilds_files.leaderboard_predictions(board, outputs))
        read = authors_read(path)
        assert len(read) == len(dataset.wilds_dataset.get_subset(split))
        scores = authors_score(dataset.wilds_dataset, split, read, board.encoding.value == "detections")
        logged = dataset.evaluate(split, outputs, dataset.split(split))
        for metric in board.metrics:
            assert scores[metric] == pytest.approx(logged[f"{split}/{metric}"], rel=1e-5, abs=1e-7), (split, metric)
    first = path.read_text().splitlines()[0] if path.suffix == ".csv" else ""
    expected_fields = {"CLASS_INDEX": 1, "VALUE": 1, "TASK_LOGITS": 128, "DETECTIONS": 0}[board.encoding.name]
    assert (len(first.split(",")) if first else 0) == expected_fields
    if board.encoding.name == "CLASS_INDEX":
        assert first.isdigit()  # the class index itself, not its logits


def test_a_non_finite_output_is_refused_rather_than_written_unreadable():
    with pytest.raises(wilds_files.UnwritablePredictions, match="row 1"):
        wilds_files.leaderboard_predictions(BOARDS["poverty"], torch.tensor([[0.5], [float("nan")]]))


def test_results_are_evaluate_pys_mean_and_sample_std():
    board = BOARDS["ogb-molpcba"]
    scores = [{"val": {"ap": 0.25}, "test": {"ap": 0.5}}, {"val": {"ap": 0.75}, "test": {"ap": 0.25}},
              {"val": {"ap": 0.5}, "test": {"ap": 0.125}}]
    aggregated = wilds_files.aggregate(board, scores)
    assert wilds_files.results_text(aggregated) == json.dumps(authors_aggregate(scores, board.splits, board.metrics),
                                                              indent=4)
    assert aggregated["val"] == {"ap_std": 0.25, "ap": 0.5}  # ddof=1: the sample std, as evaluate.py:181-183
    one = wilds_files.aggregate(board, scores[:1])
    assert np.isnan(one["val"]["ap_std"]) and "NaN" in wilds_files.results_text(one)


# ----- refusals, from the sweep's records alone ----------------------------------------------------------------
TRIAL = "abc123def456"


def replicate_run(seed: int, metrics: dict[str, float], order: int) -> TrialRecord:
    return TrialRecord(order=order, trial_id=TRIAL, seed=seed, sampled={"seed": seed}, status=TrialStatus.OK,
                       selection_value=0.5, best_epoch=0.0, metrics=dict(metrics))


def write_sweep(storage: Path, name: str, dataset: str, *, splits=None, seeds=(11, 22),
                state: SweepState = SweepState.FINISHED, checkpoints: bool = True) -> SweepSummary:
    """A sweep's summary.json (and with `checkpoints`, an empty best_model.pt per replicate where its completed
    record names it) as a finished sweep leaves them, for the checks that read nothing else."""
    board = BOARDS.get(dataset)
    splits = board.splits if splits is None and board else splits or ("val", "test")
    metrics = board.metrics if board else ("acc",)
    cells = {f"best/{split}/{metric}": 0.5 for split in splits for metric in metrics}
    runs = [replicate_run(seed, cells, order) for order, seed in enumerate(seeds)]
    selected = TrialRecord(order=0, trial_id=TRIAL, seed=0, sampled={}, status=TrialStatus.OK, selection_value=0.5,
                           best_epoch=0.0, metrics=dict(cells))
    summary = SweepSummary(name=name, state=state, dataset=dataset, algorithm="erm",
                           selection=Selection("ood_val", f"val/{metrics[0]}", "OOD val"), trials=[selected],
                           selected=selected, replicates=Replicates(list(seeds), len(seeds), runs, {
                               key: {"mean": 0.5, "std": 0.0, "n": len(seeds)} for key in cells} if seeds else {}))
    results = storage / name / "results"
    results.mkdir(parents=True)
    (results / "summary.json").write_text(json.dumps(summary.to_json()))
    stage = storage / f"{name}-replicate-{TRIAL}"
    for seed in seeds if checkpoints else ():
        folder = stage / "train" / f"run-{seed}" / "checkpoint_0"
        folder.mkdir(parents=True)
        (folder / "best_model.pt").write_bytes(b"")
        (stage / "completed").mkdir(exist_ok=True)
        (stage / "completed" / f"{TRIAL}-seed{seed}.json").write_text(json.dumps({"checkpoint_path": str(folder)}))
    return summary


REFUSALS = {
    "embedded dataset": (lambda s: write_sweep(s, "digits", "digits-shift"), ["digits"],
                         "sweep 'digits' is on digits-shift, which is no WILDS leaderboard dataset"),
    "missing split": (lambda s: write_sweep(s, "cam", "camelyon17", splits=("test", "val")), ["cam"],
                      "its replicates report no id_val split (best/id_val/acc_avg missing)"),
    "not finished": (lambda s: write_sweep(s, "cam", "camelyon17", state=SweepState.INTERRUPTED_REPLICATES), ["cam"],
                     "sweep 'cam' is interrupted during the replicates, not finished"),
    "no replicates": (lambda s: write_sweep(s, "cam", "camelyon17", seeds=()), ["cam"],
                      "sweep 'cam' has no finished replicates"),
    "no replicate checkpoints": (lambda s: write_sweep(s, "cam", "camelyon17", checkpoints=False), ["cam"],
                                 f"its replicates' folder '{{storage}}/cam-replicate-{TRIAL}' is not there"),
    "poverty seeds as folds": (lambda s: write_sweep(s, "pov", "poverty"), ["pov"],
                               "its 2 seed replicates would all be fold:A"),
    "two sweeps, one dataset": (lambda s: (write_sweep(s, "a", "iwildcam"), write_sweep(s, "b", "iwildcam")),
                                ["a", "b"], "sweeps 'a' and 'b' are both on iwildcam"),
    "no such sweep": (lambda s: None, ["nope"], "sweep 'nope': no results at"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_sweep_the_leaderboard_cannot_take_is_refused_in_one_line_before_any_heavy_work(case, tmp_path, capsys,
                                                                                         monkeypatch):
    make, sweeps, expected = REFUSALS[case]
    storage, out = tmp_path / "runs", tmp_path / "submission"
    storage.mkdir()
    make(storage)
    fail_on_reaching(monkeypatch, (export_wilds, "export_sweep"), (export_wilds, "rebuilt_replicate"),
                     (export_wilds, "export_device"))
    done = cli(["export", "wilds", *sweeps, "--storage", str(storage), "--out", str(out)], capsys)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("raybench: error: export wilds: ")
    assert expected.format(storage=storage) in lines[0]
    assert not out.exists()


def test_an_earlier_export_in_the_folder_is_kept_unless_forced(tmp_path, capsys, monkeypatch):
    storage, out = tmp_path / "runs", tmp_path / "submission"
    write_sweep(storage, "cam", "camelyon17")
    (out / "camelyon17").mkdir(parents=True)
    (out / "camelyon17" / "camelyon17_split:test_seed:4_epoch:best_pred.csv").write_text("1\n")
    fail_on_reaching(monkeypatch, (export_wilds, "export_sweep"))
    done = cli(["export", "wilds", "cam", "--storage", str(storage), "--out", str(out)], capsys)
    assert done.returncode == 2 and "already holds an export of camelyon17; --force replaces them" in done.stderr
    assert plan_export(ExportRequest(("cam",), out, storage, force=True))  # --force lets the plan through


# ----- where a replicate's checkpoint is -------------------------------------------------------------------------
def test_a_replicates_checkpoint_is_where_its_record_says_even_after_the_storage_moved(tmp_path):
    summary = write_sweep(tmp_path / "old", "cam", "camelyon17", seeds=(11,))
    shutil.move(tmp_path / "old", tmp_path / "moved")  # the completed record still names the old path
    stage = tmp_path / "moved" / f"cam-replicate-{TRIAL}"
    assert find_checkpoint(stage, summary, summary.replicates.runs[0]) == \
        stage / "train" / "run-11" / "checkpoint_0" / "best_model.pt"


def test_a_record_without_its_checkpoint_path_finds_the_last_checkpoint_of_its_tune_trial(tmp_path):
    """Function trials recorded before their completed record kept the path: the Tune trial folder with the
    replicate's seed, its last checkpoint (each holds the best epoch so far, so the last the selected one)."""
    summary = write_sweep(tmp_path, "cam", "camelyon17", seeds=(11,), checkpoints=False)
    stage = tmp_path / f"cam-replicate-{TRIAL}"
    for seed in (11, 111):
        trial = stage / f"function_trial_0000{seed % 2}_seed={seed}"
        for index in range(3):
            (trial / f"checkpoint_00000{index}").mkdir(parents=True)
            (trial / f"checkpoint_00000{index}" / "best_model.pt").write_bytes(b"")
        (trial / "params.json").write_text(json.dumps({"lr": 0.1, "seed": seed}))
    assert find_checkpoint(stage, summary, summary.replicates.runs[0]) == \
        stage / "function_trial_00001_seed=11" / "checkpoint_000002" / "best_model.pt"


def test_a_checkpoint_of_another_epoch_is_refused(tiny_dataset, tmp_path):
    """The file found must be the replicate's selected epoch: its record says which epoch its weights are."""
    from raybench.trainer import TrainConfig, Trainer
    from raybench.trainer.console import ConsoleCallback

    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "erm", "epochs": 1, "max_steps_per_epoch": 1,
                                    "device": "cpu", "seed": 11})
    Trainer(config, [ConsoleCallback(io.StringIO(), tmp_path)], tiny_dataset).fit()
    summary = write_sweep(tmp_path / "runs", "t", "camelyon17", seeds=(11,), checkpoints=False)
    summary.dataset = "tiny"
    plan = SweepPlan(summary, BOARDS["camelyon17"], ())
    _, record = export_wilds.rebuilt_replicate(plan, Replicate("seed:0", 11, 0, tmp_path / "best_model.pt"))
    assert record.epoch == 0 and record.settings["seed"] == 11
    with pytest.raises(UsageError, match="holds epoch 1, not its selected epoch 3"):
        export_wilds.rebuilt_replicate(plan, Replicate("seed:0", 11, 2, tmp_path / "best_model.pt"))
    with pytest.raises(UsageError, match="was trained with seed 11, not 12"):
        export_wilds.rebuilt_replicate(plan, Replicate("seed:0", 12, 0, tmp_path / "best_model.pt"))


# ----- one real sweep, exported --------------------------------------------------------------------------------
SWEEP_SETTINGS = {"epochs": 2, "max_steps_per_epoch": 2, "batch_size": 4, "eval_batch_size": 16}


def one_graph_outputs(model, wilds_dataset, index: int) -> torch.Tensor:
    """The model's logits for one graph, read by the wilds dataset's own get_input: no raybench split involved."""
    from torch_geometric.data import Batch

    with torch.no_grad():
        return model(Batch.from_data_list([wilds_dataset.get_input(int(index))]))[0]


def same_rows(rows: torch.Tensor, expected: torch.Tensor) -> bool:
    """Each row equal to its expected logits up to float32 rounding at that row's scale (a few steps of a large
    learning rate leave logits of 1e6 beside ones near 0, whose rounding is the large ones')."""
    scale = expected.abs().amax(dim=1, keepdim=True).clamp_min(1.0)
    return bool(((rows.float() - expected).abs() / scale).max() < 1e-5)


def test_a_finished_sweeps_replicates_become_the_leaderboards_files(wilds_root, sweep_env, store_uri, tmp_path,
                                                                  capsys, monkeypatch):
    storage, out = tmp_path / "runs", tmp_path / "submission"
    args = ["sweep", "erm", "--dataset", "ogb-molpcba", "--trials", "1", "--replicates", "2", "--executor",
            "function", "--max-concurrent", "1", "--name", "ogb", "--storage", str(storage), "--tracking-uri",
            store_uri, *[word for key, value in SWEEP_SETTINGS.items() for word in ("--set", f"{key}={value}")]]
    env = {**sweep_env, "RAYBENCH_WILDS_ROOT": str(wilds_root), "HF_HUB_OFFLINE": "1"}
    swept = run_cli(args, env, tmp_path)
    assert swept.returncode == 0, swept.stderr[-3000:]
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(wilds_root))

    done = cli(["export", "wilds", "ogb", "--storage", str(storage), "--out", str(out), "--device", "cpu"], capsys)
    assert done.returncode == 0, done.stderr[-3000:]
    board = BOARDS["ogb-molpcba"]
    names = sorted(board.file_name(split, f"seed:{k}") for split in ("val", "test") for k in range(2))
    assert sorted(path.name for path in (out / "ogb-molpcba").iterdir()) == names
    assert sorted(path.name for path in out.iterdir()) == ["ogb-molpcba", "ogb-molpcba_results.json"]

    # Every row is the replicate's selected model on that example of the wilds subset, in the subset's order.
    from raybench.api import load_model
    from raybench.data.wilds.adapter import load_wilds

    wilds_dataset = load_wilds("ogb-molpcba", wilds_root, unlabeled=False)
    summary = json.loads((storage / "ogb" / "results" / "summary.json").read_text())
    plan = plan_export(ExportRequest(("ogb",), tmp_path / "elsewhere", storage))[0]
    assert [r.seed for r in plan.replicates] == [run["seed"] for run in summary["replicates"]["runs"]]
    scores = []
    for replicate in plan.replicates:
        model, _ = load_model(replicate.checkpoint)
        assert f"{replicate.name}: raybench seed {replicate.seed}, epoch {replicate.best_epoch + 1}" in done.stdout
        per_split = {}
        for split in board.splits:
            rows = authors_read(out / "ogb-molpcba" / board.file_name(split, replicate.name))
            indices = wilds_dataset.get_subset(split).indices
            assert rows.shape == (len(indices), 128)
            expected = torch.stack([one_graph_outputs(model, wilds_dataset, index) for index in indices])
            assert same_rows(rows, expected), split
            per_split[split] = authors_score(wilds_dataset, split, rows, detection=False)
        scores.append(per_split)

    # The results file is evaluate.py's aggregate of those files, and the sweep's own replicate summary.
    results_text = (out / "ogb-molpcba_results.json").read_text()
    assert results_text == json.dumps(authors_aggregate(scores, board.splits, board.metrics), indent=4)
    results, logged = json.loads(results_text), summary["replicates"]["summary"]
    for split in board.splits:
        assert results[split]["ap"] == pytest.approx(logged[f"best/{split}/ap"]["mean"], rel=1e-9, abs=1e-12)
        assert results[split]["ap_std"] == pytest.approx(logged[f"best/{split}/ap"]["std"], rel=1e-9, abs=1e-12)
    assert "evaluate.py reads 3 replicates (seed:0 .. seed:2)" in done.stderr  # the leaderboard asks for 3

    again = cli(["export", "wilds", "ogb", "--storage", str(storage), "--out", str(out), "--device", "cpu"], capsys)
    assert again.returncode == 2 and "--force replaces them" in again.stderr
    forced = cli(["export", "wilds", "ogb", "--storage", str(storage), "--out", str(out), "--device", "cpu",
                  "--force"], capsys)
    assert forced.returncode == 0 and (out / "ogb-molpcba_results.json").read_text() == results_text
    assert not [path for path in out.iterdir() if path.name.startswith(".raybench-export-")]
