"""Checkpoints that say what they are: `best_model.pt` holds its weights beside the record of what built them,
reads with weights_only=True, rebuilds into the trained module on its own; bare state dicts of earlier runs
still load as weights wherever they loaded; a damaged record is one error naming its key."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

import raybench
from raybench.algorithms.frozen import load_featurizer
from raybench.checkpoints import (
    BEST_MODEL_FILE,
    ModelRecord,
    ModelRecordError,
    read_model_checkpoint,
    read_model_file,
    write_model_checkpoint,
)
from raybench.models import ModelSpec, build_model
from raybench.models.base import read_state_dict
from raybench.rebuild import evaluate_split, rebuild_model
from raybench.tracking import TrackingError, download_selected_checkpoint
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.console import ConsoleCallback


def train(tiny_dataset, output: Path, **values):
    """`raybench train --output OUTPUT` in process: the console callback keeps the checkpoint in OUTPUT."""
    config = TrainConfig.from_flat({"dataset": "tiny", "epochs": 2, "max_steps_per_epoch": 2, "device": "cpu",
                                    **values})
    trainer = Trainer(config, [ConsoleCallback(io.StringIO(), output)], tiny_dataset)
    return trainer, trainer.fit()


@pytest.fixture(scope="module")
def trained(tiny_dataset, tmp_path_factory):
    """One ERM run of the tiny dataset with its checkpoint folder, shared by the tests that only read it."""
    output = tmp_path_factory.mktemp("erm-run")
    return (*train(tiny_dataset, output, algorithm="erm"), output)


def lenet_state(tiny_dataset) -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    return build_model("lenet", ModelSpec(tiny_dataset.input_shape, tiny_dataset.task.n_outputs)).state_dict()


def same_featurizer(model, state: dict[str, torch.Tensor]) -> bool:
    own = model.featurizer.state_dict()
    return bool(own) and all(torch.equal(value, state[f"featurizer.{key}"]) for key, value in own.items())


# ----- a checkpoint holds its record and rebuilds into the trained module ---------------------------------
def test_best_model_holds_the_record_and_reads_with_weights_only(trained):
    trainer, result, output = trained
    loaded = torch.load(output / BEST_MODEL_FILE, weights_only=True)
    assert set(loaded) == {"raybench_model", "record", "weights"} and loaded["raybench_model"] == 1
    record = ModelRecord.from_dict(loaded["record"])
    assert (record.model, record.input_shape, record.n_outputs, record.layout) == ("lenet", (3, 16, 16), 4, "")
    assert (record.dataset, record.data_seed, record.algorithm, record.task) == ("tiny", 0, "erm", "classification")
    assert record.epoch == result.best_epoch and record.raybench_version == raybench.__version__
    assert record.settings == trainer.config.to_flat()  # resolved: the dataset's defaults filled in
    assert record.settings["lr"] == 3e-3 and record.settings["model"] == "lenet"
    for key, value in result.best_model.state_dict().items():
        assert torch.equal(loaded["weights"][key], value), key


@pytest.mark.parametrize("algorithm, extra", [("erm", {}), ("newt_probe", {"c_grid": "0.5,3"})])
def test_rebuilt_model_gives_the_trained_models_outputs_and_metrics(algorithm, extra, tiny_dataset, tmp_path):
    """NeWT's probe shapes the model (a standardising head): the rebuild must shape it the same way to load."""
    _, result = train(tiny_dataset, tmp_path, algorithm=algorithm, **extra)
    model, record = rebuild_model(tmp_path)  # the folder, as a sweep's checkpoint is given
    assert not model.training and record.algorithm == algorithm
    batch = tiny_dataset.views.plain(tiny_dataset.split("test").x[:16])
    result.best_model.eval()
    with torch.no_grad():
        assert torch.equal(model(batch), result.best_model(batch))
    scored = evaluate_split(model, record, "test", dataset=tiny_dataset)
    assert scored["test/acc"] == pytest.approx(result.best_metrics["test/acc"], abs=1e-9)


# ----- bare state dicts of earlier runs still load as weights --------------------------------------------
def test_a_bare_state_dict_still_loads_as_weights_but_is_not_rebuilt(tiny_dataset, tmp_path):
    state = lenet_state(tiny_dataset)
    torch.save(state, tmp_path / BEST_MODEL_FILE)
    weights, record = read_model_file(tmp_path)
    assert record is None and all(torch.equal(weights[k], v) for k, v in state.items())
    fresh = build_model("lenet", ModelSpec(tiny_dataset.input_shape, tiny_dataset.task.n_outputs))
    teacher = read_model_checkpoint(tmp_path, fresh)  # Noisy Student's teacher_checkpoint
    assert all(torch.equal(teacher.state_dict()[k], v) for k, v in state.items())
    featurizer = build_model("lenet", ModelSpec(tiny_dataset.input_shape, tiny_dataset.task.n_outputs))
    assert load_featurizer(featurizer, tmp_path) == tmp_path / BEST_MODEL_FILE  # features_from, raybench probe
    assert same_featurizer(featurizer, state)
    with pytest.raises(ModelRecordError, match=r"^model checkpoint '.*best_model\.pt' holds weights only, no model "
                                               r"record .*cannot be rebuilt on its own$") as caught:
        rebuild_model(tmp_path / BEST_MODEL_FILE)
    assert "\n" not in str(caught.value)


def test_a_checkpoint_with_its_record_loads_wherever_a_bare_one_does(trained, tiny_dataset):
    output = trained[-1]
    featurizer = build_model("lenet", ModelSpec(tiny_dataset.input_shape, tiny_dataset.task.n_outputs))
    load_featurizer(featurizer, output)
    teacher = read_model_checkpoint(output, build_model("lenet", ModelSpec(tiny_dataset.input_shape, 4)))
    weights, _ = read_model_file(output)
    assert all(torch.equal(teacher.state_dict()[k], v) for k, v in weights.items())
    assert same_featurizer(featurizer, weights)


# ----- a damaged record is one error naming the key -------------------------------------------------------
def record_dict(trained) -> dict:
    return torch.load(trained[-1] / BEST_MODEL_FILE, weights_only=True)["record"]


@pytest.mark.parametrize("damage, key", [
    (lambda r: r.pop("n_outputs"), "n_outputs"),
    (lambda r: r.update(input_shape="3x16x16"), "input_shape"),
    (lambda r: r.update(input_shape=[3, 0, 16]), "input_shape"),
    (lambda r: r.update(data_seed=True), "data_seed"),
    (lambda r: r.update(model=7), "model"),
    (lambda r: r.update(settings=[1, 2]), "settings"),
    (lambda r: r.update(algorithm="dann"), "algorithm"),
])
def test_a_damaged_record_is_one_error_naming_the_key(damage, key, trained, tmp_path):
    loaded = torch.load(trained[-1] / BEST_MODEL_FILE, weights_only=True)
    damage(loaded["record"])
    torch.save(loaded, tmp_path / BEST_MODEL_FILE)
    with pytest.raises(ModelRecordError, match=rf"^model checkpoint '.*best_model\.pt': model record key {key!r} ") \
            as caught:
        rebuild_model(tmp_path)
    assert "\n" not in str(caught.value)
    assert set(read_state_dict(tmp_path / BEST_MODEL_FILE, "model checkpoint")) == set(loaded["weights"])  # still loads as weights


def test_record_round_trips_and_a_newer_format_is_named(trained, tmp_path):
    record = ModelRecord.from_dict(record_dict(trained))
    assert ModelRecord.from_dict(record.to_dict()) == record
    with pytest.raises(ModelRecordError, match=r"^the model record is a list, not a mapping$"):
        ModelRecord.from_dict([])
    write_model_checkpoint(tmp_path / BEST_MODEL_FILE, read_model_file(trained[-1])[0], record)
    loaded = torch.load(tmp_path / BEST_MODEL_FILE, weights_only=True)
    torch.save({**loaded, "raybench_model": 2}, tmp_path / BEST_MODEL_FILE)
    with pytest.raises(ModelRecordError, match=r"has format 2, newer than this raybench reads \(up to 1\)"):
        rebuild_model(tmp_path)


def test_a_record_naming_what_this_process_lacks_is_one_line(trained, tmp_path):
    weights, record = read_model_file(trained[-1])
    for changes, words in (({"model": "no-such-model"}, r"cannot rebuild model 'no-such-model'"),
                           ({"task": "ranking"}, r"model record key 'task' is 'ranking'")):
        write_model_checkpoint(tmp_path / BEST_MODEL_FILE, weights, ModelRecord.from_dict({**record.to_dict(), **changes}))
        with pytest.raises(ModelRecordError, match=words) as caught:
            rebuild_model(tmp_path)
        assert "\n" not in str(caught.value)


# ----- the selected checkpoint from the tracking store ---------------------------------------------------
def test_a_sweep_without_a_selected_checkpoint_is_named(store_uri, tmp_path):
    client = MlflowClient(tracking_uri=store_uri)
    experiment = client.create_experiment("raybench")
    client.create_run(experiment, tags={"raybench.sweep": "bare", "stage": "sweep"}, run_name="bare")
    with pytest.raises(TrackingError, match=r"^sweep bare: running .*; it logged no selected checkpoint "
                                            r"\(selected_checkpoint/best_model\.pt on its parent run \w+\)$"):
        download_selected_checkpoint(store_uri, "bare", tmp_path / "out")
    with pytest.raises(TrackingError, match=r"no sweep named 'other'"):
        download_selected_checkpoint(store_uri, "other", tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())
