"""NeWT's probe: a linear SVM on frozen features, its C chosen by 3-fold cross-validation on train."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from raybench.algorithms.base import AlgorithmContext, RoundContext, StepOutput
from raybench.algorithms.dfr import LinearHead
from raybench.algorithms.frozen import FrozenFeaturizer, FrozenHparams
from raybench.algorithms.groups import parse_grid
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_TWO, setting

if TYPE_CHECKING:  # scikit-learn is imported when a probe is fitted: it costs seconds in every Ray worker
    from sklearn.pipeline import Pipeline

NEWT_C_GRID = "1e-4,1e-3,1e-2,0.1,1,10,100,1000"  # NeWT Sec. 5.3
C_PARAM = "svc__C"


@dataclass
class NeWTHparams(FrozenHparams):
    c_grid: str = setting(NEWT_C_GRID, help="the SVM's C values tried (comma-separated, each > 0); "
                                            "cross-validation on train picks one")
    folds: int = setting(3, allowed=AT_LEAST_TWO, help="cross-validation folds on train")

    def __post_init__(self) -> None:
        if any(c <= 0 for c in parse_grid(self.c_grid, "c_grid")):
            raise ValueError(f"c_grid: expected positive numbers, got {self.c_grid!r}")


def newt_pipeline() -> Pipeline:
    """NeWT's classifier: standardise each feature, L2-normalise each vector, then a linear SVM with squared
    hinge loss solved in the primal by liblinear (tol 1e-5, at most 1,000 iterations), one-vs-rest."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import Normalizer, StandardScaler
    from sklearn.svm import LinearSVC

    return Pipeline([
        ("standardise", StandardScaler()),
        ("normalise", Normalizer()),
        ("svc", LinearSVC(dual=False, tol=1e-5, max_iter=1000)),
    ])


@dataclass
class FittedProbe:
    """The pipeline refit on all of train at the chosen C, and how every C scored in cross-validation."""

    pipeline: Pipeline
    best_c: float
    best_accuracy: float  # the chosen C's mean held-out-fold accuracy
    cv_accuracy: list[float]  # mean held-out-fold accuracy per C, in grid order


def fit_newt_probe(z: np.ndarray, y: np.ndarray, c_grid: Sequence[float], folds: int, seed: int) -> FittedProbe:
    """GridSearchCV over C with explicit stratified folds (shuffled by `seed`, so a run is reproducible);
    ties go to the first C in grid order, as GridSearchCV breaks them."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
    search = GridSearchCV(newt_pipeline(), {C_PARAM: list(c_grid)}, cv=splitter, scoring="accuracy")
    search.fit(z, y)
    return FittedProbe(search.best_estimator_, float(search.best_params_[C_PARAM]), float(search.best_score_),
                       [float(s) for s in search.cv_results_["mean_test_score"]])


@dataclass
class ProbeWeights:
    """A fitted pipeline as numbers: standardise by (mean, scale), L2-normalise, then `linear`."""

    mean: np.ndarray
    scale: np.ndarray
    linear: LinearHead


def probe_weights(pipeline: Pipeline, n_outputs: int) -> ProbeWeights:
    """The pipeline's decision function as one logit per output class, whose argmax is the SVM's prediction.

    Multi-class: one row per one-vs-rest SVM. Binary: LinearSVC fits one function f and predicts the second
    class iff f > 0, so the first class scores 0 and the second f (a tie, f = 0, goes to the first in both).
    Classes absent from train score below any fitted one: normalised inputs have norm <= 1, so no fitted
    score falls under -(max_k ||w_k|| + |b_k|).
    """
    scaler, svc = pipeline.named_steps["standardise"], pipeline.named_steps["svc"]
    classes = svc.classes_.astype(int)
    weight, bias = np.zeros((n_outputs, svc.coef_.shape[1])), np.zeros(n_outputs)
    fitted = classes[1:] if len(classes) == 2 else classes
    weight[fitted], bias[fitted] = svc.coef_, svc.intercept_
    absent = np.setdiff1d(np.arange(n_outputs), classes)
    bias[absent] = -(np.linalg.norm(weight, axis=1) + np.abs(bias)).max() - 1.0
    return ProbeWeights(scaler.mean_, scaler.scale_, LinearHead(weight, bias))


class ProbeHead(nn.Module):
    """The fitted pipeline in torch: (z - mean) / scale, divided by its L2 norm (a zero vector stays zero, as
    scikit-learn's Normalizer leaves it), then z @ weight.T + bias; in float64 with autocast off, so it
    reproduces the pipeline's decision function, not a bfloat16 rounding of it.

    Its state dict holds `mean` and `scale` beside `weight` and `bias`: a saved probe is the whole pipeline,
    so loading its `best_model.pt` into a plain model (a Noisy Student teacher, say) is refused as another
    architecture instead of silently dropping the standardisation; `features_from` reads the featurizer only.
    """

    def __init__(self, n_features: int, n_outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_outputs, n_features, dtype=torch.float64), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n_outputs, dtype=torch.float64), requires_grad=False)
        self.register_buffer("mean", torch.zeros(n_features, dtype=torch.float64))
        self.register_buffer("scale", torch.ones(n_features, dtype=torch.float64))

    @torch.no_grad()
    def set(self, fitted: ProbeWeights) -> None:
        for target, value in ((self.mean, fitted.mean), (self.scale, fitted.scale),
                              (self.weight, fitted.linear.weight), (self.bias, fitted.linear.bias)):
            target.copy_(torch.as_tensor(value, dtype=torch.float64))

    def forward(self, z: Tensor) -> Tensor:
        with torch.autocast(z.device.type, enabled=False):
            standard = (z.to(torch.float64) - self.mean) / self.scale
            norm = standard.norm(dim=1, keepdim=True)
            unit = standard / torch.where(norm == 0, torch.ones_like(norm), norm)
            return unit @ self.weight.T + self.bias


@register("newt_probe")
class NeWTProbe(FrozenFeaturizer):
    """NeWT's frozen-feature evaluation (Van Horn et al., 2021, Sec. 5.1 and 5.3), as a model the trainer scores.

    With the featurizer f frozen (`features_from`, see raybench/algorithms/frozen.py), features z = f(x) of
    the labeled train split (plain view, eval mode) train
        GridSearchCV(StandardScaler -> Normalizer -> LinearSVC(dual=False, tol=1e-5, max_iter=1000),
                     C in `c_grid`, `folds`-fold stratified cross-validation on train, accuracy),
    refit on all of train at the chosen C, whose decision function becomes the model's head (`ProbeHead`).
    Nothing is trained by gradient descent: the trainer evaluates the model once, on every evaluation split
    (none of which the probe saw). The chosen C is a fact of the run (`best_c`) and, with the cross-validated
    accuracy of every C, the stage "probe" (a nested MLflow run in a sweep, as DFR's last-layer fit).
    """

    Hparams = NeWTHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    stages = ("probe",)
    trains_by_gradient = False

    def __init__(self, model: FeaturizerHead, hparams: NeWTHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        model.head = ProbeHead(model.n_features, context.task.n_outputs)

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        facts = self.take_featurizer(context)
        train = context.train
        assert train is not None and train.y is not None, "the probe is fit on the labeled train split"
        assert context.report_stage is not None
        z = context.predict(self.model.featurizer, train, self.context.views.plain).double().numpy()
        grid = parse_grid(self.hparams.c_grid, "c_grid")
        probe = fit_newt_probe(z, train.y.numpy(), grid, self.hparams.folds, context.seed)
        self.model.head.set(probe_weights(probe.pipeline, self.context.task.n_outputs))
        scores = {f"{c:g}": round(score, 4) for c, score in zip(grid, probe.cv_accuracy)}
        context.report_stage("probe", {"best_c": probe.best_c, "cv_accuracy": probe.best_accuracy},
                             {"cv_accuracy_by_c": str(scores), **facts})
        return {**facts, "best_c": f"{probe.best_c:g}", "cv_accuracy": f"{probe.best_accuracy:.4f}",
                "cv_accuracy_by_c": str(scores)}

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        """The probe's loss on a batch, for reporting only: nothing here takes a gradient (the trainer does
        not call it, since the probe is fit in closed form)."""
        with torch.no_grad():
            loss = self.supervised_loss(self.model.head(self.features(labeled.x, labeled.index)).float(), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss})
