"""colored-moons: scikit-learn's two moons with a colour that predicts the label in training and betrays it OOD.

A tabular Colored MNIST (Arjovsky et al., 2019, Sec. 5.1), small enough that a sweep trial takes seconds on a CPU.
Each example is x = (u, v, s) in R^3:

- (u, v): a point of `sklearn.datasets.make_moons` (noise MOON_NOISE), centred; its moon is the clean label y0;
- y: the label, y0 flipped with probability LABEL_NOISE, so the shape alone predicts y at best at 1 - LABEL_NOISE =
  75 % in every domain: the invariant mechanism;
- s: the colour, +1 or -1, equal to 2y - 1 with the domain's probability p_d and to 1 - 2y otherwise, plus Gaussian
  noise (COLOUR_NOISE). It is a linear feature, easier to learn than the moons, and in training more predictive on
  average (p_d 0.9, 0.8, 0.7 against the shape's 0.75).

Domains (ids index DOMAIN_NAMES, groups are the domains) and examples per domain (SPLIT_PLAN):

| domain          | p_d  | train | id_val, id_test | val, test (OOD) | unlabeled                       |
|-----------------|------|-------|-----------------|-----------------|---------------------------------|
| `train-0.9`     | 0.9  | 2,000 | 200 each        |                 | train_unlabeled 200             |
| `train-0.8`     | 0.8  | 2,000 | 200 each        |                 | train_unlabeled 200             |
| `train-0.7`     | 0.7  | 2,000 | 200 each        |                 | train_unlabeled 200             |
| `ood-val-0.3`   | 0.3  |       |                 | val 600         | val_unlabeled 600               |
| `ood-test-0.1`  | 0.1  |       |                 | test 600        | test_unlabeled 600              |

A model that reads the colour scores about p_d: up to 90 % in training, 10 % on OOD test; one that reads the shape
alone scores about 75 % everywhere. The training risks of a colour-reading model differ between the three training
domains; those of the shape-reading one do not, which is what V-REx's variance penalty rewards. Measured (the
WILDS protocol, 10 trials and 3 replicates each, `raybench sweep vrex|erm --dataset colored-moons`): ERM 78.5 +- 0.5 %
ID test, 33.9 +- 7.6 % OOD test; V-REx 76.0 +- 1.4 % and 67.1 +- 4.3 %.

Every (split, domain) chunk draws from its own generator, seeded from a hash of (seed, split, domain), never from
global random state: the same seed gives the same arrays, and building the dataset disturbs nothing. Generation
takes milliseconds, so nothing is cached on disk (`data_dir` is unused).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import make_moons
from torch import Tensor, nn

from raybench import metrics
from raybench.data import DATASETS
from raybench.data.base import (
    LABELED_SPLITS,
    USUAL_ALIGNMENT_PENALTIES,
    ShiftDataset,
    Split,
    Task,
    TaskKind,
    TrainDefaults,
    Views,
)
from raybench.models import MODELS, FeaturizerHead, ModelSpec, load_local_weights

NAME = "colored-moons"
MODEL = "moons_mlp"
N_CLASSES = 2
N_FEATURES = 3  # (u, v, s)
LABEL_NOISE = 0.25
MOON_NOISE = 0.1
COLOUR_NOISE = 0.1
MOON_CENTRE = (0.5, 0.25)  # make_moons' points span about [-1, 2] x [-0.5, 1]

# domain name -> P(colour agrees with the label)
COLOUR_AGREEMENT: dict[str, float] = {
    "train-0.9": 0.9, "train-0.8": 0.8, "train-0.7": 0.7, "ood-val-0.3": 0.3, "ood-test-0.1": 0.1,
}
DOMAIN_NAMES: tuple[str, ...] = tuple(COLOUR_AGREEMENT)
TRAIN_DOMAINS: tuple[str, ...] = DOMAIN_NAMES[:3]

# split -> {domain: examples}
SPLIT_PLAN: dict[str, dict[str, int]] = {
    "train": dict.fromkeys(TRAIN_DOMAINS, 2_000),
    "id_val": dict.fromkeys(TRAIN_DOMAINS, 200),
    "id_test": dict.fromkeys(TRAIN_DOMAINS, 200),
    "val": {"ood-val-0.3": 600},
    "test": {"ood-test-0.1": 600},
    "train_unlabeled": dict.fromkeys(TRAIN_DOMAINS, 200),
    "val_unlabeled": {"ood-val-0.3": 600},
    "test_unlabeled": {"ood-test-0.1": 600},
}


def chunk_seed(seed: int, split: str, domain: str) -> int:
    """A 63-bit seed private to (seed, split, domain)."""
    digest = hashlib.sha256(json.dumps([NAME, seed, split, domain]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generate_chunk(seed: int, split: str, domain: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` examples of `domain` for `split`: x float32 (n, 3), y int64 (n,)."""
    rng = np.random.default_rng(chunk_seed(seed, split, domain))
    moons, clean = make_moons(n_samples=n, noise=MOON_NOISE, random_state=int(rng.integers(2**31 - 1)))
    # make_moons returns the two moons in order (the first half, then the second); shuffle their order
    order = rng.permutation(n)
    moons, clean = moons[order] - np.asarray(MOON_CENTRE), clean[order]
    y = np.where(rng.random(n) < LABEL_NOISE, 1 - clean, clean)
    sign = 2 * y - 1
    colour = np.where(rng.random(n) < COLOUR_AGREEMENT[domain], sign, -sign) + COLOUR_NOISE * rng.standard_normal(n)
    x = np.column_stack([moons, colour]).astype(np.float32)
    return x, y.astype(np.int64)


def generate(seed: int) -> dict[str, dict[str, Tensor]]:
    """Every split's x, y (labeled splits only) and domain ids, as tensors."""
    arrays: dict[str, dict[str, Tensor]] = {}
    for split, counts in SPLIT_PLAN.items():
        chunks = [generate_chunk(seed, split, domain, n) for domain, n in counts.items()]
        domains = [np.full(n, DOMAIN_NAMES.index(domain), dtype=np.int64) for domain, n in counts.items()]
        arrays[split] = {"x": torch.from_numpy(np.concatenate([x for x, _ in chunks])),
                         "y": torch.from_numpy(np.concatenate([y for _, y in chunks])),
                         "domain": torch.from_numpy(np.concatenate(domains))}
    return arrays


def build_splits(seed: int) -> dict[str, Split]:
    splits = {}
    for name, arrays in generate(seed).items():
        labeled = name in LABELED_SPLITS
        splits[name] = Split(name, arrays["x"], arrays["y"] if labeled else None, arrays["domain"],
                             arrays["domain"].clone())
    return splits


def as_float(x: Tensor) -> Tensor:
    return x.float()


# Tabular points have no augmentation: every view is the points themselves. Without "strong_augmentation" in the
# dataset's capabilities, FixMatch is refused and every `augment` setting defaults to off (TrainConfig.resolve).
VIEWS = Views(plain=as_float, weak=as_float, strong=as_float)


def accuracy_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return metrics.accuracy(outputs, y)


@DATASETS.register("colored-moons")
def build_colored_moons(data_dir: Path, seed: int) -> ShiftDataset:
    """Two moons whose colour predicts the label in 3 training domains (p 0.9/0.8/0.7); OOD val p 0.3, test p 0.1."""
    splits = build_splits(seed)
    return ShiftDataset(
        name=NAME,
        task=Task(TaskKind.CLASSIFICATION, N_CLASSES),
        splits=splits,
        metrics={"acc": accuracy_metric},
        selection_metric="val/acc",
        # TrainDefaults' own Adam, lr 1e-3, no weight decay, batch 64, k = 3 from test_unlabeled; 20 epochs of
        # 93 steps, 1,860 in all, about the span of DomainBed's anneal search (1 to 10^4 steps over its 5,000).
        # No `lr_center` or `max_batch_size`: a space's `lr` centre is this lr and its max_batch_size rule this
        # batch, so raybench's shipped `erm` space runs here unchanged.
        defaults=TrainDefaults(model=MODEL, epochs=20, algorithm_hparams=USUAL_ALIGNMENT_PENALTIES),
        views=VIEWS,
        domain_names=DOMAIN_NAMES,
        input_shape=(N_FEATURES,),
        description="make_moons with label noise 0.25 and a colour agreeing with the label at p 0.9/0.8/0.7 in "
                    "training, 0.3 on OOD val, 0.1 on OOD test (a tabular Colored MNIST).",
        info={name: str(len(split)) for name, split in splits.items()},
        capabilities=frozenset({"features"}),
    )


@MODELS.register("moons_mlp")
def build_moons_mlp(spec: ModelSpec) -> FeaturizerHead:
    """A two-layer MLP (64 ReLU units each) over flat feature vectors, for colored-moons."""
    width = 64
    n_inputs = int(np.prod(spec.input_shape))
    featurizer = nn.Sequential(nn.Flatten(), nn.Linear(n_inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
    load_local_weights(featurizer, spec.weights)  # a featurizer state dict, as raybench's own models read it
    return FeaturizerHead(featurizer, n_features=width, n_outputs=spec.n_outputs)
