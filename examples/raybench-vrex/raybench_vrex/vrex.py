"""V-REx: minimise the training domains' mean risk plus lambda times the variance of their risks."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.algorithms.base import Algorithm, Hparams, SamplingPlan, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, Split, TaskKind
from raybench.settings import MAX_COUNT, NON_NEGATIVE, Allowed, Suggest, setting


@dataclass
class VRExHparams(Hparams):
    penalty: float = setting(10.0, allowed=NON_NEGATIVE, suggest=Suggest.loguniform(0.1, 1e5),
                             help="lambda, the weight of the variance of the domains' risks once the anneal is over "
                                  "(DomainBed vrex_lambda: 1e1, searched 10^U(-1, 5))")
    # A float so that a space can draw it log-uniformly, as DomainBed does; the step count is int() of it, as
    # DomainBed's int(10**r.uniform(0, 4)) is.
    penalty_anneal_iters: float = setting(500.0, allowed=Allowed(low=0, limit=MAX_COUNT),
                                          suggest=Suggest.loguniform(1, 1e4),
                                          help="training steps at lambda = 1 before lambda = penalty; int() of it "
                                               "(DomainBed vrex_penalty_anneal_iters: 500, searched int(10^U(0, 4)))")
    balanced: bool = setting(True, help="domain-balanced labeled batches, like DomainBed's one equal-sized "
                                        "minibatch per training domain")


def domain_risks(losses: Tensor, domains: Tensor) -> Tensor:
    """The mean loss of each domain present in the batch, in ascending domain id (absent domains left out)."""
    present, index = torch.unique(domains, return_inverse=True)
    sums = torch.zeros(len(present), dtype=losses.dtype, device=losses.device).index_add(0, index, losses)
    counts = torch.bincount(index, minlength=len(present)).to(losses.dtype)
    return sums / counts


def vrex_loss(risks: Tensor, penalty_weight: float) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, mean risk, penalty) as DomainBed computes them: mean = risks.mean(), penalty = ((risks - mean) ** 2)
    .mean(), the biased (population) variance, and loss = mean + penalty_weight * penalty."""
    mean = risks.mean()
    penalty = ((risks - mean) ** 2).mean()
    return mean + penalty_weight * penalty, mean, penalty


@register("vrex")
class VREx(Algorithm):
    """V-REx (Krueger et al., 2021): mean of the training domains' risks + lambda * their variance, lambda = 1 at first.

    loss = (1/m) sum_e R_e + lambda_t * (1/m) sum_e (R_e - (1/m) sum_e' R_e')^2,
    R_e = mean CE over the batch's examples of training domain e, the m domains present in the batch;
    lambda_t = 1 for t < int(penalty_anneal_iters), else `penalty`; t = the trainer's step (labeled batch) count.

    This is the loss of DomainBed's VREx (facebookresearch/DomainBed at b93c22a1cfc3b2428398272c1a116c8de1f4139e,
    domainbed/algorithms.py lines 745-788): lines 753-756 pick the penalty weight (vrex_lambda once
    update_count >= vrex_penalty_anneal_iters, else 1.0); lines 763-768 take one cross-entropy per domain
    minibatch; lines 770-772 are mean = losses.mean(), penalty = ((losses - mean) ** 2).mean() (the biased,
    population variance) and loss = mean + penalty_weight * penalty. The loss is not divided by lambda: DomainBed
    does not. (The authors' Colored MNIST code does, capybaralet/REx_code_release at 47dfb3a,
    InvariantRiskMinimization/colored_mnist/main.py lines 228-230; it also sums its two environments' risks,
    lines 210-211, where DomainBed averages them, and its penalty is (R_1 - R_2)^2, line 219.) Defaults and search
    ranges are DomainBed's, domainbed/hparams_registry.py lines 110-113: vrex_lambda 1e1, 10^U(-1, 5);
    vrex_penalty_anneal_iters 500, int(10^U(0, 4)).

    Deviations, because raybench's trainer owns the optimiser and the batches:
    - DomainBed resets Adam when the penalty switches on (algorithms.py lines 774-780, "because it doesn't like
      the sharp jump in gradient magnitudes"). The Algorithm base offers no hook to reset or rebuild the
      optimiser mid-round (the trainer builds it once per round, raybench/trainer/loop.py `_new_optimizer`), so
      the optimiser here keeps its state across the switch.
    - DomainBed draws one minibatch per training domain, each of its batch size. Here one labeled batch of
      `batch_size` examples is drawn, domain-balanced when `balanced` (the trainer's SamplingPlan); a domain
      absent from a batch is left out of that step's mean and variance.
    - DomainBed counts optimiser updates (update_count); here t is the trainer's step, which counts labeled batches:
      the same when grad_accum is 1 (the shipped space's and the datasets' default).
    """

    Hparams = VRExHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def penalty_weight(self, step: int) -> float:
        """lambda at `step`: 1 during the anneal, then `penalty` (DomainBed algorithms.py lines 753-756)."""
        return self.hparams.penalty if step >= int(self.hparams.penalty_anneal_iters) else 1.0

    def sampling(self, train: Split) -> SamplingPlan | None:
        return SamplingPlan(balance_by=train.domain) if self.hparams.balanced else None

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        outputs = self.model(self.view(labeled.x, False))
        losses = F.cross_entropy(outputs, labeled.y, reduction="none")
        risks = domain_risks(losses, labeled.domain.to(losses.device))
        weight = self.penalty_weight(step)
        loss, mean, penalty = vrex_loss(risks, weight)
        return StepOutput(loss, {"loss/supervised": mean.detach(), "vrex/penalty": penalty.detach(),
                                 "vrex/lambda": torch.tensor(weight, device=losses.device)})
