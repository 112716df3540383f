"""Integrity of what a trial reports and reads: safe checkpoints, the paper's teacher, last-round selection,
identical pseudo-labels on every rank, held-out selection for DFR/Dispel, blind selection, bad files."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from raybench import metrics
from raybench.algorithms.dfr import DFR
from raybench.algorithms.ssa import split_halves
from raybench.models import ModelSpec, build_model
from raybench.models.base import UnreadableWeightsError
from raybench.report_keys import SELECTION_BLIND
from raybench.trainer import Callback, ConfigError, TrainConfig, Trainer
from raybench.trainer.loop import STATE_FILE, Shard
from raybench.trainer.rng import seed_everything

REPO = Path(__file__).resolve().parents[1]


class Recorder(Callback):
    """Facts, stage reports and epoch reports in the order the trainer gave them; optional checkpoints."""

    def __init__(self, checkpoint_root: Path | None = None) -> None:
        self.events: list[tuple[str, object]] = []
        self.facts: dict[str, str] = {}
        self.stages = []
        self.reports = []
        self.root = checkpoint_root

    def on_info(self, facts: dict[str, str]) -> None:
        self.facts.update(facts)
        self.events.append(("info", dict(facts)))

    def on_stage(self, report) -> None:
        self.stages.append(report)

    def on_epoch_end(self, report) -> None:
        self.reports.append(report)
        self.events.append(("epoch", report.epoch))
        if self.root is not None:
            report.write_checkpoint(self.root / f"epoch_{report.epoch}")


def config(**values) -> TrainConfig:
    return TrainConfig.from_flat({"epochs": 2, "device": "cpu", "max_steps_per_epoch": 2, **values})


def teacher_file(dataset, path: Path) -> Path:
    """A plain lenet state dict: a valid `teacher_checkpoint` that spares the tests a teacher stage."""
    torch.manual_seed(7)
    torch.save(build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs)).state_dict(), path)
    return path


class Payload:
    """Unpickling this runs os.mkdir(marker): stands in for any code a malicious checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


# ----- A. trial states load with weights_only=True; nothing in raybench unpickles code ----------------------
@pytest.mark.parametrize("values", [
    {"algorithm": "fixmatch", "optimizer": "adam", "scheduler": "linear"},
    {"algorithm": "erm", "optimizer": "sgd", "scheduler": "step", "augment": True},
    {"algorithm": "noisy_student", "epochs": 1, "iterations": 2},  # resumes across the round boundary
], ids=["fixmatch-adam-linear", "erm-sgd-step", "noisy_student-rounds"])
def test_trial_state_loads_weights_only_and_resumes_exactly(values, tiny_dataset, tmp_path):
    values = dict(values)
    if values["algorithm"] == "noisy_student":
        values = {**values, "teacher_checkpoint": str(teacher_file(tiny_dataset, tmp_path / "teacher.pt"))}
    cfg = config(epochs=values.pop("epochs", 3), **values)
    full = Trainer(cfg, [Recorder(tmp_path / "ckpt")], tiny_dataset).fit()
    for state_file in sorted((tmp_path / "ckpt").glob(f"*/{STATE_FILE}")):
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}
    resumed = Trainer(cfg, dataset=tiny_dataset).fit(resume_from=tmp_path / "ckpt" / "epoch_0")
    assert resumed.history == full.history
    assert resumed.best_epoch == full.best_epoch
    for key, value in full.final_state.items():
        torch.testing.assert_close(resumed.final_state[key], value, rtol=0, atol=0)


def test_a_state_holding_pickled_code_is_refused_not_run(tiny_dataset, tmp_path):
    marker = tmp_path / "payload_ran"
    folder = tmp_path / "evil"
    folder.mkdir()
    torch.save({"config": {}, "progress": Payload(marker)}, folder / STATE_FILE)
    with pytest.raises(UnreadableWeightsError, match=r"trial state .*state\.pt' was refused: it holds pickled") as caught:
        Trainer(config(), dataset=tiny_dataset).fit(resume_from=folder)
    assert "\n" not in str(caught.value)
    assert not marker.exists()
    torch.load(folder / STATE_FILE, weights_only=False)  # the file is what it claims: a full unpickle runs it
    assert marker.exists()


def test_every_torch_load_in_raybench_is_weights_only():
    """Except the wilds compatibility layer, which hands ogb its own processed graphs (not ours to read)."""
    unsafe = []
    for path in sorted((REPO / "raybench").rglob("*.py")):
        if path.relative_to(REPO).as_posix() == "raybench/data/wilds/compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    unsafe.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert unsafe == []


# ----- B. Noisy Student: the paper's teacher, last-round selection, rank-independent labels ----------------
def test_the_first_teacher_is_one_cached_stage_at_the_dataset_defaults(tiny_dataset, tmp_path):
    cache = tmp_path / "stages"
    sources, keys = [], []
    for trial in ({"lr": 0.01, "unlabeled_ratio": 3, "dropout": 0.5}, {"lr": 0.001, "unlabeled_ratio": 7, "dropout": 0.2}):
        recorder = Recorder()
        cfg = config(algorithm="noisy_student", epochs=1, iterations=1, grad_accum=4, stage_cache=str(cache), **trial)
        result = Trainer(cfg, [recorder], tiny_dataset).fit()
        [stage] = recorder.stages
        assert stage.name == "teacher"
        sources.append(result.info["round_0/teacher_source"])
        keys.append(stage.key)
    assert keys[0] == keys[1]
    assert sources[0].startswith(f"ERM+augmentation teacher trained (stage {keys[0]}, best val/acc=")
    assert sources[1].startswith(f"ERM+augmentation teacher cached (stage {keys[0]}, best val/acc=")
    teacher = json.loads((cache / keys[0] / "summary.json").read_text())["config"]
    defaults = tiny_dataset.defaults
    assert (teacher["algorithm"], teacher["augment"], teacher["patience"]) == ("erm", True, None)
    assert (teacher["epochs"], teacher["lr"], teacher["batch_size"], teacher["grad_accum"]) == (
        defaults.epochs, defaults.lr, defaults.batch_size, 1)
    # A shorter teacher (smoke runs) is another stage, not the full-budget one under its key.
    recorder = Recorder()
    cfg = config(algorithm="noisy_student", epochs=1, iterations=1, teacher_epochs=1, stage_cache=str(cache))
    Trainer(cfg, [recorder], tiny_dataset).fit()
    [short] = recorder.stages
    assert not short.cached and short.key != keys[0]
    assert json.loads((cache / short.key / "summary.json").read_text())["config"]["epochs"] == 1


def test_a_multi_round_run_reports_the_best_epoch_of_its_last_round(tiny_dataset, tmp_path, monkeypatch):
    by_epoch = [0.9, 0.8, 0.3, 0.4]  # round 0's first epoch beats every epoch of round 1
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, algorithm: {"val/acc": by_epoch[self.progress.epoch]})
    recorder = Recorder()
    cfg = config(algorithm="noisy_student", epochs=2, iterations=2, max_steps_per_epoch=1,
                 teacher_checkpoint=str(teacher_file(tiny_dataset, tmp_path / "teacher.pt")))
    result = Trainer(cfg, [recorder], tiny_dataset).fit()
    assert result.best_epoch == 3
    assert result.best_metrics["val/acc"] == 0.4 and result.history[-1]["selection/best"] == 0.4
    last = recorder.reports[-1]
    assert last.best_metrics["val/acc"] == 0.4
    assert last.metrics["epoch"] - last.metrics["epochs_since_best"] == 3  # the sweep's best_epoch
    best = result.best_model.state_dict()
    for key, value in result.final_state.items():  # epoch 3 is also the last: the kept model is round 1's
        if key.startswith("featurizer."):
            torch.testing.assert_close(best[key], value, rtol=0, atol=0)


def test_pseudo_labels_are_identical_on_every_rank(tiny_dataset, tmp_path):
    cfg = config(algorithm="noisy_student", iterations=1, seed=5,
                 teacher_checkpoint=str(teacher_file(tiny_dataset, tmp_path / "teacher.pt")))
    labels = []
    for rank in (0, 1):
        trainer = Trainer(cfg, dataset=tiny_dataset, shard=Shard(rank=rank, world_size=2))
        seed_everything(cfg.seed + rank)  # what fit() does on each rank
        algorithm = trainer._new_algorithm()
        algorithm.begin_round(trainer._round_context(0))
        labels.append(algorithm.pseudo_labels)
    assert torch.equal(labels[0], labels[1])
    # Not vacuous: this teacher's labels do depend on the weak view's random draw.
    teacher = trainer.load_model(cfg.hparams["teacher_checkpoint"], "teacher_checkpoint")
    unlabeled = trainer.unlabeled_split
    draws = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        draws.append(trainer.predict(teacher, unlabeled, tiny_dataset.views.weak).argmax(-1))
    assert not torch.equal(draws[0], draws[1])


# ----- C. DFR and Dispel choose on the half of val the chosen model never saw, then refit on all of it ----
@pytest.mark.parametrize("algorithm, extra", [("dfr", {}), ("dispel", {"s_grid": "0.5"})])
def test_last_layer_methods_are_scored_on_the_held_out_half_they_never_fit(algorithm, extra, tiny_group_dataset,
                                                                          tmp_path, monkeypatch):
    dataset = dataclasses.replace(tiny_group_dataset, metrics={
        **tiny_group_dataset.metrics, "rows": lambda out, y, group: float(len(y)),  # sees which rows are scored
        "logit_sum": lambda out, y, group: float(out.double().sum())})  # ... and which model scored them
    seen: dict[str, list] = {"val": [], "scored_fits": [], "final_fits": [], "scorers": []}
    embed, score, fit_ensemble, scored_rows = DFR.embed, DFR.score, DFR.fit_ensemble, DFR.scored_rows

    def spy_embed(self, context, split):
        z = embed(self, context, split)
        if split.name == "val":
            seen["val"].append(self.standardize(z))
        return z

    def spy_score(self, z, y, group, fit, held_out, setting, seed):
        seen["scored_fits"].append(fit)
        return score(self, z, y, group, fit, held_out, setting, seed)

    def spy_fit(self, z, y, group, setting, seed):
        seen["final_fits"].append(z)
        return fit_ensemble(self, z, y, group, setting, seed)

    def spy_rows(self):
        rows = scored_rows(self)
        seen["scorers"] += [r.model for r in rows.values()]
        return rows

    for name, spy in (("embed", spy_embed), ("score", spy_score), ("fit_ensemble", spy_fit), ("scored_rows", spy_rows)):
        monkeypatch.setattr(DFR, name, spy)
    recorder = Recorder()
    cfg = config(dataset=dataset.name, algorithm=algorithm, reference_epochs=1, c_grid="1.0,0.1", n_ensemble=2,
                 stage_cache=str(tmp_path), **extra)
    result = Trainer(cfg, [recorder], dataset).fit()

    val = dataset.split("val")
    fit, held_out = split_halves(val, 0.5, cfg.seed)
    assert result.best_metrics["val/rows"] == len(held_out) != len(val)
    # Every candidate was fit on the fit half only; the chosen one's model scores the held-out rows ...
    assert seen["scored_fits"] and all(set(f.tolist()) == set(fit.tolist()) for f in seen["scored_fits"])
    scorer = seen["scorers"][-1].eval()
    with torch.no_grad():
        outputs = scorer(dataset.views.plain(val.x[held_out]))
    y, group = val.y[held_out], val.group[held_out]
    assert result.best_metrics["val/worst_group_acc"] == pytest.approx(metrics.worst_group_accuracy(outputs, y, group))
    assert result.best_metrics["val/acc"] == pytest.approx(metrics.accuracy(outputs, y))
    assert result.best_metrics["val/logit_sum"] == pytest.approx(float(outputs.double().sum()), rel=1e-5)
    # ... while the final head, which test scores, is refit on every val row (SpuCo's refit).
    [z_val] = seen["val"]
    [final] = seen["final_fits"]
    assert final.shape == z_val.shape and np.allclose(final, z_val)
    assert not torch.equal(scorer.head.weight, result.best_model.head.weight)
    assert recorder.facts["selection_note"] == (
        f"val metrics: the chosen setting's model, fit on 50% of val, scored on the held-out {len(held_out)} rows; "
        "the final head is refit on all of val")


# ----- D. a selection metric that never moved makes selection blind --------------------------------------
@pytest.mark.parametrize("epochs, patience", [(3, None), (10, 2)])
def test_a_constant_selection_metric_is_flagged_before_the_last_report(epochs, patience, tiny_dataset, monkeypatch):
    monkeypatch.setitem(tiny_dataset.metrics, "acc", lambda out, y, g: 0.5)
    recorder = Recorder()
    result = Trainer(config(epochs=epochs, patience=patience, max_steps_per_epoch=1), [recorder], tiny_dataset).fit()
    assert result.info["selection_blind"] == SELECTION_BLIND
    flagged = recorder.events.index(("info", {"selection_blind": SELECTION_BLIND}))
    epoch_events = [i for i, (kind, _) in enumerate(recorder.events) if kind == "epoch"]
    assert epoch_events[-2] < flagged < epoch_events[-1]  # carried by the last report, raised at no earlier one


@pytest.mark.parametrize("by_epoch", [[0.5, 0.5, 0.6], [0.2, 0.4, 0.4]], ids=["moves-last", "moves-first"])
def test_a_selection_metric_that_moved_is_never_flagged(by_epoch, tiny_dataset, monkeypatch):
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, algorithm: {"val/acc": by_epoch[self.progress.epoch]})
    recorder = Recorder()
    result = Trainer(config(epochs=3, max_steps_per_epoch=1), [recorder], tiny_dataset).fit()
    assert "selection_blind" not in result.info and "selection_blind" not in recorder.facts


# ----- E. a bad teacher_checkpoint is one ConfigError line before any training, and again at use -----------
def _truncated(dataset, path: Path) -> None:
    teacher_file(dataset, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _other_architecture(dataset, path: Path) -> None:
    torch.save(build_model("lenet5", ModelSpec(dataset.input_shape, dataset.task.n_outputs)).state_dict(), path)


BAD_TEACHERS = {
    "missing": (lambda dataset, path: None, "does not exist"),
    "truncated": (_truncated, "is not a readable torch file"),
    "text": (lambda dataset, path: path.write_text("not a checkpoint\n"), "is not a readable torch file"),
    "other-architecture": (_other_architecture, "holds a model of another architecture"),
    "not-a-state-dict": (lambda dataset, path: torch.save({"epoch": 3}, path), "is not a state dict"),
    "malicious": (lambda dataset, path: torch.save({"head.weight": Payload(path.with_name("ran"))}, path),
                  "was refused: it holds pickled Python objects"),
}


@pytest.mark.parametrize("kind", BAD_TEACHERS)
def test_a_bad_teacher_checkpoint_is_one_config_error_naming_the_file(kind, tiny_dataset, tmp_path):
    write, expected = BAD_TEACHERS[kind]
    path = tmp_path / "teacher.pt"
    write(tiny_dataset, path)
    with pytest.raises(ConfigError) as caught:
        Trainer(config(algorithm="noisy_student", teacher_checkpoint=str(path)), dataset=tiny_dataset)
    assert caught.value.key == "teacher_checkpoint"
    assert str(path) in caught.value.detail and expected in caught.value.detail
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "ran").exists()


def test_a_teacher_checkpoint_spoilt_after_the_check_fails_at_use(tiny_dataset, tmp_path):
    path = teacher_file(tiny_dataset, tmp_path / "teacher.pt")
    trainer = Trainer(config(algorithm="noisy_student", teacher_checkpoint=str(path)), dataset=tiny_dataset)
    path.write_text("overwritten\n")
    with pytest.raises(ConfigError, match=re.escape(f"teacher_checkpoint: model checkpoint {str(path)!r}")):
        trainer.fit()


def test_missing_model_weights_fail_the_trainer_and_the_config_check(tiny_dataset, tmp_path):
    missing = tmp_path / "lenet_weights.pt"
    trainer = Trainer(config(model_weights=str(missing)), dataset=tiny_dataset)
    with pytest.raises(ConfigError, match=re.escape(f"model_weights: model weights {str(missing)!r} does not exist")):
        trainer.fit()
    with pytest.raises(ConfigError, match="lenet_weights.pt"):
        trainer.config.check_model_builds(tiny_dataset)


def test_source_files_named_in_docstrings_exist():
    """Module docstrings send readers to files (e.g. the trainer); a renamed file must not leave a stale pointer."""
    stale = []
    for path in sorted((REPO / "raybench").rglob("*.py")):
        for ref in re.findall(r"raybench/[\w/]+\.py", path.read_text()):
            if not (REPO / ref).is_file():
                stale.append(f"{path.relative_to(REPO)} -> {ref}")
    assert stale == []
