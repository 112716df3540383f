"""Optimisers and learning-rate schedules by name (the names datasets and configs use)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, StepLR

OptimizerFactory = Callable[..., Optimizer]

OPTIMIZERS: dict[str, OptimizerFactory] = {
    "sgd": lambda groups, wd, momentum, **impl: torch.optim.SGD(groups, momentum=momentum, weight_decay=wd, **impl),
    "adam": lambda groups, wd, momentum, **impl: torch.optim.Adam(groups, weight_decay=wd, **impl),
    "adamw": lambda groups, wd, momentum, **impl: torch.optim.AdamW(groups, weight_decay=wd, **impl),
    "lars": lambda groups, wd, momentum, **impl: _lars(groups, wd, momentum),
}
# How an optimiser's update is computed (the `optimizer_impl` setting): PyTorch's own three implementations of SGD,
# Adam and AdamW. "fused" is one kernel for all parameters and the only one that can skip an update on the device
# (its `found_inf` input, what GradScaler uses); "foreach" batches the parameters into a few kernels; "for-loop" is a
# kernel per parameter. "auto": fused where PyTorch has it for the optimiser on the device, else foreach.
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for-loop")
WITH_IMPLS = frozenset({"sgd", "adam", "adamw"})  # LARS (lightly's) has one implementation: a loop over parameters


def impl_problem(name: str, impl: str) -> str | None:
    """Why `optimizer_impl` cannot apply to the optimiser `name` on any device, or None."""
    if name not in WITH_IMPLS and impl in ("fused", "foreach"):
        return f"expected auto or for-loop for {name} (it has one implementation, a loop over parameters), got {impl!r}"
    return None


def fused_on(device: torch.device) -> bool:
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    return device.type in _get_fused_kernels_supported_devices()


def impl_options(name: str, impl: str, device: torch.device) -> dict[str, bool]:
    """The keyword arguments that select `impl` for the optimiser `name` on `device`."""
    problem = impl_problem(name, impl)
    if problem:
        raise ValueError(f"optimizer_impl: {problem}")
    if name not in WITH_IMPLS:
        return {}
    if impl == "auto":
        impl = "fused" if fused_on(device) else "foreach"
    if impl == "fused" and not fused_on(device):
        raise ValueError(f"optimizer_impl: expected auto, foreach or for-loop on {device.type} (PyTorch has no fused "
                         f"{name} there), got 'fused'")
    return {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}


def _lars(groups: list[dict[str, Any]], weight_decay: float, momentum: float) -> Optimizer:
    """SGD with layer-wise trust ratios (trust 0.001), as SwAV's LARC: lightly's LARS, stepped without host reads."""
    return _device_lars()(groups, lr=groups[0]["lr"], momentum=momentum, weight_decay=weight_decay,
                          trust_coefficient=0.001)


def _device_lars() -> type[Optimizer]:
    """lightly's LARS with its step's two `if p_norm != 0 and g_norm != 0` per parameter (host reads of the device,
    every step) turned into a `torch.where`: the same update, number for number (tests/test_device_step.py checks it
    against lightly's own), and no wait for the GPU. Defined on first use: lightly is imported only by SwAV's runs."""
    from lightly.utils.lars import LARS

    class DeviceLARS(LARS):
        @torch.no_grad()
        def step(self, closure: Callable[[], float] | None = None) -> float | None:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(p, group)
            return loss

        def _update(self, p: Tensor, group: dict[str, Any]) -> None:
            d_p, weight_decay, momentum = p.grad, group["weight_decay"], group["momentum"]
            if weight_decay != 0:  # lightly scales only where both norms are non-zero, and adds no decay elsewhere
                p_norm, g_norm = torch.norm(p), torch.norm(d_p)
                lars_lr = p_norm / (g_norm + p_norm * weight_decay + group["eps"]) * group["trust_coefficient"]
                d_p = torch.where((p_norm != 0) & (g_norm != 0), d_p.add(p, alpha=weight_decay) * lars_lr, d_p)
            if momentum != 0:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    buf = state["momentum_buffer"] = torch.clone(d_p).detach()
                else:
                    buf = state["momentum_buffer"]
                    buf.mul_(momentum).add_(d_p, alpha=1 - group["dampening"])
                d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
            p.add_(d_p, alpha=-group["lr"])

    return DeviceLARS


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


def build_optimizer(name: str, groups: list[dict[str, Any]], weight_decay: float, momentum: float,
                    impl: str = "auto", device: torch.device | None = None) -> Optimizer:
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {name!r}")
    options = impl_options(name, impl, device or torch.device("cpu"))
    return OPTIMIZERS[name](groups, weight_decay, momentum, **options)


class GuardedStep:
    """An optimiser step that a device-side flag can cancel, so the host never reads whether a loss was finite.

    A fused optimiser takes the flag as its `found_inf` and leaves weights, moments and step counts as they were. Any
    other steps on zeroed gradients where the flag is set (so its state stays finite: momentum decays once, a step
    count advances) and has its parameters put back from a copy taken before (one foreach copy), with `torch.where`:
    no update with a non-finite gradient reaches a weight either way.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.native = all(group.get("fused") for group in optimizer.param_groups)

    def step(self, skip: Tensor) -> None:
        if self.native:
            self.optimizer.found_inf = skip.float()  # type: ignore[attr-defined]  read by torch's fused kernels
            self.optimizer.step()
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        before = torch._foreach_mul([p.detach() for p in params], 1.0) if params else []
        keep = skip.bool()
        for param in params:
            param.grad = torch.where(keep, 0.0, param.grad)
        self.optimizer.step()
        for param, old in zip(params, before, strict=True):
            param.detach().copy_(torch.where(keep, old, param.detach()))


def build_schedule(name: str | None, optimizer: Optimizer, total_steps: int, gamma: float) -> Schedule:
    if name not in SCHEDULES:
        raise ValueError(f"scheduler: expected one of {', '.join(str(k) for k in SCHEDULES)}, got {name!r}")
    return SCHEDULES[name](optimizer, total_steps, gamma)
