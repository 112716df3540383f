"""The training step as a GPU needs it: a non-finite loss is caught on the device, its update (and every later one)
is cancelled there, and the host hears of it only at the epoch's end or a declared interval; `compile` trains as
eager does; the GPU settings refuse bad values in one line."""
from __future__ import annotations

import pytest
import torch
from helpers.cli import cli
from host_syncs import counted_method, counting_syncs

from raybench.algorithms.erm import ERM
from raybench.trainer import DivergenceError, TrainConfig, Trainer
from raybench.trainer.optim import GuardedStep, build_optimizer

BAD_STEP = 5  # the second step of epoch 1: four steps an epoch on the tiny dataset at batch 32


def _nan_from(step_index: int, monkeypatch) -> None:
    original = ERM.objective

    def diverging(self, labeled, unlabeled, step):
        out = original(self, labeled, unlabeled, step)
        if step >= step_index:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(ERM, "objective", diverging)


def _weights_after_each_step(monkeypatch) -> dict[int, dict[str, torch.Tensor]]:
    """The model's parameters after every training step, by step."""
    seen: dict[int, dict[str, torch.Tensor]] = {}
    original = Trainer._train_step

    def recording(self, algorithm, forward, optimizer, schedule, sums, step, labeled, unlabeled):
        original(self, algorithm, forward, optimizer, schedule, sums, step, labeled, unlabeled)
        seen[step] = {name: p.detach().clone() for name, p in algorithm.named_parameters()}

    monkeypatch.setattr(Trainer, "_train_step", recording)
    return seen


@pytest.mark.parametrize("optimizer, impl", [("adam", "fused"), ("sgd", "fused"), ("adam", "foreach"),
                                             ("sgd", "for-loop"), ("lars", "auto")])
def test_a_nan_loss_changes_no_weight_and_is_named_at_the_epochs_end(tiny_dataset, monkeypatch, optimizer, impl):
    _nan_from(BAD_STEP, monkeypatch)
    weights = _weights_after_each_step(monkeypatch)
    config = TrainConfig.from_flat({"epochs": 3, "batch_size": 32, "optimizer": optimizer, "optimizer_impl": impl,
                                    "lr": 0.01, "momentum": 0.9})
    with pytest.raises(DivergenceError, match=rf"loss is nan at epoch 1, step {BAD_STEP} .*no weights were updated"):
        Trainer(config, dataset=tiny_dataset).fit()
    assert max(weights) == 7, "the epoch did not run to its end: the host read the flag inside the epoch"
    before = weights[BAD_STEP - 1]
    assert any(not torch.equal(before[n], weights[BAD_STEP - 2][n]) for n in before), "nothing trained before"
    for step in range(BAD_STEP, 8):
        for name, value in weights[step].items():
            assert torch.equal(value, before[name]), f"{name} changed at step {step}, after the NaN at {BAD_STEP}"


def test_divergence_check_every_stops_within_its_interval(tiny_dataset, monkeypatch):
    _nan_from(BAD_STEP, monkeypatch)
    weights = _weights_after_each_step(monkeypatch)
    config = TrainConfig.from_flat({"epochs": 3, "batch_size": 32, "divergence_check_every": 1})
    with pytest.raises(DivergenceError, match=rf"at epoch 1, step {BAD_STEP} "):
        Trainer(config, dataset=tiny_dataset).fit()
    assert max(weights) == BAD_STEP


def test_a_finite_run_takes_no_host_read_in_its_steps(tiny_dataset, monkeypatch):
    """The loop's own part (the divergence watch, the guarded step, clipping, the sums): ERM on a plain view."""
    with counting_syncs() as counter:
        pass
    monkeypatch.setattr(Trainer, "_train_step", counted_method(Trainer, "_train_step", counter))
    config = TrainConfig.from_flat({"epochs": 1, "batch_size": 32, "grad_clip": 1.0, "optimizer": "sgd"})
    trainer = Trainer(config, dataset=tiny_dataset)
    trainer.fit()
    assert trainer.progress.spent.steps == 4
    assert counter.total == 0, counter.worst()


def test_the_guard_restores_weights_for_an_optimizer_without_found_inf():
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = build_optimizer("sgd", [{"params": [param], "lr": 0.1}], 0.0, 0.9, "for-loop")
    guard = GuardedStep(optimizer)
    assert not guard.native
    param.grad = torch.full((3,), float("nan"))
    guard.step(torch.tensor(True))
    assert torch.equal(param.detach(), torch.ones(3))
    param.grad = torch.ones(3)
    guard.step(torch.tensor(False))
    assert torch.allclose(param.detach(), torch.full((3,), 0.9))


def _losses(dataset, mode: str, **settings) -> list[float]:
    config = TrainConfig.from_flat({"epochs": 2, "batch_size": 16, "max_steps_per_epoch": 3, "compile": mode,
                                    "seed": 1, **settings})
    return [h["train/loss/total"] for h in Trainer(config, dataset=dataset).fit().history]


# Inductor fuses and reorders float arithmetic, so a compiled step rounds differently from the eager one; over
# six Adam steps the averaged losses stayed within 1e-4 relative here, well inside this bound.
COMPILE_RTOL = 1e-3


@pytest.mark.parametrize("model", ["lenet", "dabs_transformer_small"])
def test_compiled_training_follows_the_eager_losses(tiny_dataset, model):
    """Inductor draws dropout masks from its own generator; `fallback_random` makes it draw eager's, so what is
    compared is the arithmetic, not two samples of dropout."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    eager = _losses(tiny_dataset, "none", model=model)
    torch._dynamo.utils.counters.clear()
    with inductor.patch(fallback_random=True):
        compiled = _losses(tiny_dataset, "default", model=model)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert eager[0] != eager[1], "the losses did not move: the comparison would be vacuous"
    assert compiled == pytest.approx(eager, rel=COMPILE_RTOL)


def test_compile_wraps_the_model_in_place(tiny_dataset):
    from raybench.trainer.loop import compile_model

    trainer = Trainer(TrainConfig.from_flat({"epochs": 1}), dataset=tiny_dataset)
    model = trainer.new_model()
    keys = list(model.state_dict())
    compile_model(model, "default")
    assert all(getattr(part, "_compiled_call_impl", None) is not None for part in model.compile_parts())
    assert list(model.state_dict()) == keys  # a compiled run's checkpoint loads into an eager model


TRAIN = ["train", "--epochs", "1", "--set", "max_steps_per_epoch=1"]


@pytest.mark.parametrize("setting, expected", [
    ("compile=fast", "compile: expected one of none, default, reduce-overhead, got 'fast'"),
    ("optimizer_impl=turbo", "optimizer_impl: expected one of auto, fused, foreach, for-loop, got 'turbo'"),
    ("divergence_check_every=-1", "divergence_check_every: expected an integer >= 0"),
    ("image_decoding=gpu", "image_decoding: expected one of host, device, got 'gpu'"),
    ("image_decoding=device", "image_decoding: dataset 'digits-shift' keeps its inputs decoded in memory"),
])
def test_a_bad_gpu_setting_is_one_line(setting, expected, capsys, in_private_dirs):
    result = cli([*TRAIN, "--set", setting], capsys)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_lars_has_no_fused_implementation(capsys, in_private_dirs):
    result = cli([*TRAIN, "--set", "optimizer=lars", "--set", "optimizer_impl=fused"], capsys)
    assert result.returncode == 2
    assert "optimizer_impl: expected auto or for-loop for lars" in result.stderr.strip()
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_trainer_decodes_jpeg_files_where_it_trains(tmp_path, monkeypatch):
    """image_decoding=device: the trainer's splits hand it encoded bytes, decoded by the move to its device."""
    from raybench.data.wilds.adapter import EncodedImages
    from tests.wilds_fixtures import iwildcam

    iwildcam.write(tmp_path)
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(tmp_path))
    values = {"dataset": "iwildcam", "model": "lenet", "model_weights": None, "input_size": 32, "epochs": 1,
              "batch_size": 4, "max_steps_per_epoch": 2, "device": "cpu"}
    runs = {}
    for where in ("host", "device"):
        trainer = Trainer(TrainConfig.from_flat({**values, "image_decoding": where}))
        runs[where] = trainer.fit().history[-1]
        encoded = isinstance(trainer.train_split.x[torch.arange(2)], EncodedImages)
        assert encoded == (where == "device")
    assert runs["device"]["train/loss/total"] == pytest.approx(runs["host"]["train/loss/total"], rel=0.05)


def test_lars_steps_as_lightlys_without_reading_the_device():
    from lightly.utils.lars import LARS

    torch.manual_seed(0)
    shapes = [(4, 3), (3,), (2, 2)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ours[2].data.zero_()  # a zero norm: lightly neither scales nor decays it
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    mine = build_optimizer("lars", [{"params": ours, "lr": 0.5}], 1e-4, 0.9)
    reference = LARS([{"params": theirs, "lr": 0.5}], lr=0.5, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.001)
    for step in range(4):
        grads = [torch.randn(s) for s in shapes]
        grads[1] = torch.zeros(3) if step == 1 else grads[1]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        with counting_syncs() as counter:
            mine.step()
        reference.step()
        assert counter.total == 0, counter.worst()
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_text_model_compiles_its_encoder_not_its_tokenizer():
    from helpers.datasets import text_model

    model = text_model(2)
    assert model.compile_parts() == [model.featurizer.encoder, model.head]
