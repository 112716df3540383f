"""The one training loop: selection, accumulation, divergence, determinism, resume, early stopping."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from raybench.algorithms.erm import ERM
from raybench.models import FeaturizerHead
from raybench.trainer import Callback, ConfigError, DivergenceError, EpochReport, TrainConfig, Trainer
from raybench.trainer.loop import BEST_MODEL_FILE, STATE_FILE


class Recorder(Callback):
    def __init__(self, checkpoint_root: Path | None = None) -> None:
        self.reports: list[EpochReport] = []
        self.facts: dict[str, str] = {}
        self.root = checkpoint_root

    def on_info(self, facts: dict[str, str]) -> None:
        self.facts.update(facts)

    def on_epoch_end(self, report: EpochReport) -> None:
        self.reports.append(report)
        if self.root is not None:
            report.write_checkpoint(self.root / f"epoch_{report.epoch}")


def config(**values) -> TrainConfig:
    return TrainConfig.from_flat({"epochs": 2, **values})


@pytest.mark.parametrize("k, labeled, unlabeled", [(3, 16, 48), (7, 8, 56), (15, 4, 60)])
def test_batch_composition_follows_the_paper(k, labeled, unlabeled):
    cfg = config(batch_size=64, unlabeled_ratio=k)
    assert cfg.batch_sizes(uses_unlabeled=True) == (labeled, unlabeled)
    assert cfg.batch_sizes(uses_unlabeled=False) == (64, 0)


def test_best_epoch_is_the_maximum_of_the_selection_metric(tiny_dataset):
    recorder = Recorder()
    result = Trainer(config(epochs=4, lr=0.02), [recorder], tiny_dataset).fit()
    values = [h["val/acc"] for h in result.history]
    assert result.best_epoch == values.index(max(values))
    assert result.best_metrics == result.history[result.best_epoch]
    assert [r.is_best for r in recorder.reports].count(True) >= 1
    assert result.history[-1]["selection/best"] == max(values)
    for name in ("id_val/acc", "val/acc", "test/acc", "id_test/acc", "train/loss/total"):
        assert name in result.history[0]


def _mlp_model(dataset) -> FeaturizerHead:
    torch.manual_seed(123)
    featurizer = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.Tanh())
    return FeaturizerHead(featurizer, 32, dataset.task.n_outputs)


def test_k_accumulation_steps_of_b_over_k_match_one_step_of_b(tiny_dataset, monkeypatch):
    monkeypatch.setattr(Trainer, "new_model", lambda self: _mlp_model(self.dataset))
    common = {"algorithm": "erm", "optimizer": "sgd", "momentum": 0.0, "lr": 0.5, "epochs": 1}
    big = Trainer(config(**common, batch_size=32, max_steps_per_epoch=1), dataset=tiny_dataset).fit().best_model
    small = Trainer(config(**common, batch_size=16, grad_accum=2, max_steps_per_epoch=2), dataset=tiny_dataset).fit().best_model
    initial = _mlp_model(tiny_dataset)
    moved = sum((a - b).abs().sum() for a, b in zip(big.parameters(), initial.parameters()))
    assert moved > 1e-3, "the step did nothing, the comparison would be vacuous"
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_nan_loss_raises_a_clear_error_and_keeps_earlier_checkpoints(tiny_dataset, monkeypatch, tmp_path):
    original = ERM.objective

    def diverging(self, labeled, unlabeled, step):
        out = original(self, labeled, unlabeled, step)
        if step >= 5:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(ERM, "objective", diverging)
    recorder = Recorder(tmp_path)
    trainer = Trainer(config(epochs=3), [recorder], tiny_dataset)
    with pytest.raises(DivergenceError, match=r"loss is nan at epoch 1, step 5"):
        trainer.fit()
    state = torch.load(tmp_path / "epoch_0" / STATE_FILE, weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["algorithm"].values() if v.is_floating_point())
    best = torch.load(tmp_path / "epoch_0" / BEST_MODEL_FILE, weights_only=True)["weights"]
    assert all(torch.isfinite(v).all() for v in best.values() if v.is_floating_point())


@pytest.mark.parametrize("algorithm", ["fixmatch", "dann"])
def test_same_seed_same_metrics(tiny_dataset, algorithm):
    first = Trainer(config(algorithm=algorithm, seed=3), dataset=tiny_dataset).fit().history
    second = Trainer(config(algorithm=algorithm, seed=3), dataset=tiny_dataset).fit().history
    other = Trainer(config(algorithm=algorithm, seed=4), dataset=tiny_dataset).fit().history
    assert first == second
    assert first != other


def test_resume_from_an_epoch_checkpoint_continues_exactly(tiny_dataset, tmp_path):
    cfg = config(algorithm="fixmatch", epochs=3)
    full = Trainer(cfg, [Recorder(tmp_path)], tiny_dataset).fit()
    resumed = Trainer(cfg, dataset=tiny_dataset).fit(resume_from=tmp_path / "epoch_0")
    assert resumed.history == full.history
    assert resumed.best_epoch == full.best_epoch


def test_patience_stops_early(tiny_dataset, monkeypatch):
    # A constant selection metric never improves after epoch 0, so patience 2 stops after epoch 2.
    monkeypatch.setitem(tiny_dataset.metrics, "acc", lambda out, y, g: 0.5)
    recorder = Recorder()
    result = Trainer(config(epochs=10, patience=2), [recorder], tiny_dataset).fit()
    assert len(result.history) == 3 and result.best_epoch == 0
    assert "early_stopped_round_0" in recorder.facts


class StopAfter(Recorder):
    """Asks the trainer to stop once `epochs` epochs were reported, as an early-stopping scheduler does."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self.epochs = epochs

    def should_stop(self) -> bool:
        return len(self.reports) >= self.epochs


def test_a_stop_request_ends_the_run_after_that_epoch_with_its_best_so_far(tiny_dataset):
    stopper = StopAfter(2)
    result = Trainer(config(epochs=5), [stopper], tiny_dataset).fit()
    assert [r.epoch for r in stopper.reports] == [0, 1] and len(result.history) == 2
    full = Trainer(config(epochs=5), dataset=tiny_dataset).fit()
    assert result.history == full.history[:2]  # the same run, cut short: not a different one
    assert result.best_epoch == max(range(2), key=lambda e: (full.history[e]["val/acc"], -e))


def test_a_stop_request_ends_every_round_of_a_multi_round_method(tiny_dataset, tmp_path):
    stopper = StopAfter(1)
    cfg = config(algorithm="noisy_student", epochs=1, iterations=3, stage_cache=str(tmp_path / "stages"))
    result = Trainer(cfg, [stopper], tiny_dataset).fit()
    assert len(stopper.reports) == 1 and len(result.history) == 1


def test_noisy_student_trains_its_own_teacher_then_reuses_a_checkpoint(tiny_dataset, tmp_path):
    recorder = Recorder(tmp_path)
    cfg = config(algorithm="noisy_student", epochs=1, iterations=2, stage_cache=str(tmp_path / "stages"))
    result = Trainer(cfg, [recorder], tiny_dataset).fit()
    assert result.info["round_0/teacher_source"].startswith("ERM+augmentation teacher trained (stage ")
    assert result.info["round_1/teacher_source"] == "best student of round 0"
    assert len(result.history) == 2
    teacher = tmp_path / "epoch_1"
    again = Trainer(config(algorithm="noisy_student", epochs=1, iterations=1, teacher_checkpoint=str(teacher)),
                    dataset=tiny_dataset).fit()
    assert again.info["round_0/teacher_source"] == f"checkpoint {teacher}"


def test_bad_selection_metric_is_named(tiny_dataset):
    with pytest.raises(ConfigError, match="selection_metric: expected one of .*val/acc.*got 'val/auc'"):
        Trainer(config(selection_metric="val/auc"), dataset=tiny_dataset)


def _ddp_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from helpers.datasets import make_tiny_dataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        Trainer.new_model = lambda self: _mlp_model(self.dataset)
        original = ERM.objective

        def half_batches_only(self, labeled, unlabeled, step):
            assert len(labeled) == 16, f"rank {rank} got {len(labeled)} examples of a global batch of 32"
            return original(self, labeled, unlabeled, step)

        ERM.objective = half_batches_only
        cfg = config(algorithm="erm", optimizer="sgd", momentum=0.0, lr=0.5, epochs=1, batch_size=32, max_steps_per_epoch=2)
        model = Trainer(cfg, dataset=make_tiny_dataset()).fit().best_model
        if rank == 0:
            torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()


def test_two_ddp_workers_match_one_process_on_the_same_global_batches(tiny_dataset, monkeypatch, tmp_path):
    """Each rank takes half of every global batch; averaged gradients equal the single-process step."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(port, str(out)), nprocs=2, join=True)
    monkeypatch.setattr(Trainer, "new_model", lambda self: _mlp_model(self.dataset))
    cfg = config(algorithm="erm", optimizer="sgd", momentum=0.0, lr=0.5, epochs=1, batch_size=32, max_steps_per_epoch=2)
    single = Trainer(cfg, dataset=tiny_dataset).fit().best_model.state_dict()
    ddp = torch.load(out, weights_only=True)
    for key, value in single.items():
        torch.testing.assert_close(ddp[key], value, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["erm", "dann", "noisy_student"])
def test_a_run_parses_its_hyperparameters_once_per_config_it_holds(tiny_dataset, monkeypatch, algorithm):
    """The config as given and as resolved on the dataset are parsed once each; the checks, the epoch plan, the
    budget, the model files and the algorithm all read that one parse (TrainConfig.typed_hparams)."""
    from raybench.algorithms import ALGORITHMS

    cls = ALGORITHMS.get(algorithm).Hparams
    parses = []
    original = cls.from_dict.__func__
    monkeypatch.setattr(cls, "from_dict", classmethod(lambda c, values, name: parses.append(name) or original(c, values, name)))
    trainer = Trainer(config(algorithm=algorithm, epochs=1, max_steps_per_epoch=1), [], tiny_dataset)
    trainer.fit()
    assert len(parses) == 2, parses
    assert trainer.config.typed_hparams is trainer.config.typed_hparams


def _conv_weights(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.dim() == 4]


def test_memory_format_lays_out_the_conv_weights_and_changes_no_value(tiny_dataset):
    """`memory_format`: auto is channels_last on a CPU. Only the layout moves: the same weights give the same
    outputs in either layout (up to float rounding), and a state saved from one loads into the other."""
    x = tiny_dataset.splits["val"].x[:32].float()
    models, outputs = {}, {}
    for fmt in ("auto", "channels_last", "contiguous"):
        trainer = Trainer(config(model="lenet", memory_format=fmt, device="cpu"), dataset=tiny_dataset)
        torch.manual_seed(0)
        models[fmt] = trainer.new_model().eval()
        weights = _conv_weights(models[fmt])
        assert weights, "lenet has convolutions"
        laid_out = torch.channels_last if fmt != "contiguous" else torch.contiguous_format
        assert all(w.is_contiguous(memory_format=laid_out) for w in weights), fmt
        assert fmt == "contiguous" or not any(w.is_contiguous() for w in weights), "no weight changed its layout"
        with torch.no_grad():
            outputs[fmt] = models[fmt](x)
    assert torch.allclose(outputs["auto"], outputs["contiguous"], atol=1e-5)
    assert torch.allclose(outputs["channels_last"], outputs["contiguous"], atol=1e-5)

    torch.manual_seed(1)
    other = Trainer(config(model="lenet", device="cpu"), dataset=tiny_dataset).new_model().eval()
    models["contiguous"].load_state_dict(other.state_dict())  # channels-last tensors into contiguous ones
    with torch.no_grad():
        assert torch.allclose(models["contiguous"](x), other(x), atol=1e-5)
    assert all(w.is_contiguous() for w in _conv_weights(models["contiguous"])), "loading changed the layout"
