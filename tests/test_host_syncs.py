"""No registered algorithm's training step makes the host wait for the device.

Each algorithm trains for real (`Trainer.fit`, one short epoch on CPU) with only `Trainer._train_step` counted
(tests/host_syncs.py says what counts and why a CPU can stand in for a GPU); a stage trainer's nested steps count
too. Evaluation, once per epoch, is not counted. A closed-form method takes no step of its own, which is checked.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import host_syncs
import pytest
import torch
from helpers.datasets import make_tiny_dataset
from test_algorithms import SHORT_SETUP, subject_for

from raybench.algorithms import ALGORITHMS, frozen, mlm
from raybench.algorithms.base import masked_bce
from raybench.models import text
from raybench.trainer import TrainConfig, Trainer

STEPS = 3
BATCH_SIZE = 16

# Closed-form methods (trains_by_gradient False): a refit on frozen features, no gradient step of their own
# (DFR's and Dispel's reference stage still trains by gradient, and its steps are counted).
CLOSED_FORM = frozenset({"dfr", "dispel", "newt_probe"})


@dataclass(frozen=True)
class HostOnly:
    """A line of `function` (the one holding `code`) that works on host data only, never on a device tensor;
    `through_library` also exempts the library calls made from that line."""

    function: Callable[..., Any]
    code: str
    reason: str
    through_library: bool = False

    def site(self) -> str:
        lines, first = inspect.getsourcelines(self.function)
        hits = [first + i for i, line in enumerate(lines) if self.code in line]
        assert len(hits) == 1, f"{self.code!r} is not on exactly one line of {self.function.__qualname__}"
        return f"{host_syncs._short(inspect.getsourcefile(self.function) or '')}:{hits[0]}"

    def covers(self, site: str) -> bool:
        here = self.site()
        return site == here or (self.through_library and site.endswith(f"(from {here})"))


TRAIN_IDS_ON_HOST = HostOnly(frozen.train_keys, "ids.tolist()",
                             "a batch's example ids (Batch.index), which Batch.to leaves on the host")
PADDING_CHECKED_ON_HOST = HostOnly(text.prepared_attention_mask, "padding_mask.all()",
                                   "the tokenizer's padding mask, checked before it is copied to the device")
MASKING_ON_HOST = HostOnly(mlm.masked_batch, "collator(rows)",
                           "BERT's masking of the tokenizer's host token ids, before they are copied to the device",
                           through_library=True)
HOST_ONLY = (TRAIN_IDS_ON_HOST, PADDING_CHECKED_ON_HOST, MASKING_ON_HOST)


def host_only(site: str) -> bool:
    return any(exemption.covers(site) for exemption in HOST_ONLY)


@pytest.fixture(scope="module")
def tiny() -> Any:
    return make_tiny_dataset()


def fit_counted(name: str, dataset: Any, stage_cache: Path,
                monkeypatch: pytest.MonkeyPatch) -> tuple[Trainer, host_syncs.HostSyncCounter, list[int]]:
    """A short real run of `name`; (its trainer, the syncs counted inside every step, the steps taken)."""
    subject = subject_for(name, dataset)
    counter = host_syncs.HostSyncCounter(host_only)
    counted = host_syncs.counted_method(Trainer, "_train_step", counter)
    steps: list[int] = []

    def step(*args: Any, **kwargs: Any) -> Any:
        steps.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_step", step)
    config = TrainConfig.from_flat({"dataset": subject.dataset.name, "algorithm": name, "epochs": 1, "device": "cpu",
                                    "batch_size": BATCH_SIZE, "max_steps_per_epoch": STEPS,
                                    "stage_cache": str(stage_cache), **subject.settings, **subject.hparams,
                                    **SHORT_SETUP.get(name, {})})
    trainer = Trainer(config, dataset=subject.dataset)
    torch.manual_seed(0)
    trainer.fit()
    return trainer, counter, steps


def test_closed_form_methods_are_the_ones_that_do_not_train_by_gradient():
    assert CLOSED_FORM == {n for n in ALGORITHMS.names() if not ALGORITHMS.get(n).trains_by_gradient}


def test_host_only_exemptions_name_one_line_each():
    for exemption in HOST_ONLY:
        assert exemption.site().startswith("raybench/"), exemption.site()


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_training_step_never_waits_for_the_device(name, tiny, tmp_path, monkeypatch):
    trainer, counter, steps = fit_counted(name, tiny, tmp_path, monkeypatch)
    if name in CLOSED_FORM:
        assert trainer.progress.spent.steps == 0, f"{name} is closed-form but took a gradient step"
    else:
        assert trainer.progress.spent.steps > 0, f"{name} took no step"
    assert counter.total == 0, (f"{name}: {counter.total} host syncs in {len(steps)} steps: "
                                f"{host_syncs.summary(dict(counter.worst()))}")


def test_multilabel_loss_never_waits_for_the_device():
    """The multi-label loss (OGB's NaN for an unknown label) on a path the tiny classification runs do not take."""
    y = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    with host_syncs.counting_syncs() as counter:
        masked_bce(torch.zeros(2, 2, requires_grad=True), y).backward()
    assert counter.total == 0, host_syncs.summary(dict(counter.worst()))
