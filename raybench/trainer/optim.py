"""Optimisers and learning-rate schedules by name (the names datasets and configs use)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, StepLR

OptimizerFactory = Callable[[list[dict[str, Any]], float, float], Optimizer]

OPTIMIZERS: dict[str, OptimizerFactory] = {
    "sgd": lambda groups, wd, momentum: torch.optim.SGD(groups, momentum=momentum, weight_decay=wd),
    "adam": lambda groups, wd, momentum: torch.optim.Adam(groups, weight_decay=wd),
    "adamw": lambda groups, wd, momentum: torch.optim.AdamW(groups, weight_decay=wd),
    "lars": lambda groups, wd, momentum: _lars(groups, wd, momentum),
}


def _lars(groups: list[dict[str, Any]], weight_decay: float, momentum: float) -> Optimizer:
    """SGD with layer-wise trust ratios (trust 0.001), as SwAV's LARC; lightly's implementation."""
    from lightly.utils.lars import LARS

    return LARS(groups, lr=groups[0]["lr"], momentum=momentum, weight_decay=weight_decay, trust_coefficient=0.001)


@dataclass
class Schedule:
    """A scheduler and whether it advances per optimiser step (else per epoch)."""

    scheduler: LRScheduler | None
    per_step: bool

    def step_batch(self) -> None:
        if self.scheduler is not None and self.per_step:
            self.scheduler.step()

    def step_epoch(self) -> None:
        if self.scheduler is not None and not self.per_step:
            self.scheduler.step()


ScheduleFactory = Callable[[Optimizer, int, float], Schedule]

SCHEDULES: dict[str | None, ScheduleFactory] = {
    None: lambda opt, total_steps, gamma: Schedule(None, per_step=False),
    "step": lambda opt, total_steps, gamma: Schedule(StepLR(opt, step_size=1, gamma=gamma), per_step=False),
    "linear": lambda opt, total_steps, gamma: Schedule(
        LambdaLR(opt, lambda s: max(0.0, 1.0 - s / max(total_steps, 1))), per_step=True
    ),
    # SwAV: cosine from lr to lr / 1000 over the run, per step, no warm-up (WILDS 2.0's SwAV settings)
    "cosine": lambda opt, total_steps, gamma: Schedule(
        LambdaLR(opt, lambda s: 1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * min(s / max(total_steps, 1), 1.0)))),
        per_step=True,
    ),
    # The FixMatch decay, lr * (1 + 10 t / T)^-0.75 at optimiser step t of T, per step: WILDS' "FixMatchLR"
    # (p-lambda/wilds examples/scheduler.py lines 34-40, a LambdaLR stepped after every optimiser step, T =
    # n_train_steps = ceil(batches per epoch / gradient_accumulation_steps) x n_epochs, examples/algorithms/
    # initializer.py line 23). The authors' code gives it to Pseudo-Label, FixMatch and Noisy Student where the
    # dataset sets no scheduler (Algorithm.default_scheduler); the paper's text names no schedule, the code is followed.
    "fixmatch": lambda opt, total_steps, gamma: Schedule(
        LambdaLR(opt, lambda s: (1.0 + 10.0 * s / max(total_steps, 1)) ** -0.75), per_step=True
    ),
    # The lr as set, named, so a run can opt out of a method's default schedule (unset means "the default").
    "constant": lambda opt, total_steps, gamma: Schedule(None, per_step=False),
}


def build_optimizer(name: str, groups: list[dict[str, Any]], weight_decay: float, momentum: float) -> Optimizer:
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {name!r}")
    return OPTIMIZERS[name](groups, weight_decay, momentum)


def build_schedule(name: str | None, optimizer: Optimizer, total_steps: int, gamma: float) -> Schedule:
    if name not in SCHEDULES:
        raise ValueError(f"scheduler: expected one of {', '.join(str(k) for k in SCHEDULES)}, got {name!r}")
    return SCHEDULES[name](optimizer, total_steps, gamma)
