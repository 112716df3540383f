"""The strong view per batch: the old per-image RandAugment path against the batched one, side by side on a CPU.

Both sides take the same uint8 batch through the whole strong view (shift crop, flip, RandAugment(2 ops,
magnitude 9), Cutout, normalisation). The old side is a verbatim copy of raybench/data/augment.py as it was
before RandAugment was batched (labelled OLD below): torchvision's `v2.RandAugment` once per image, a
boolean-mask flip and mean/std copied to the device on every call; the shift crop and Cutout are today's, which
that change left as they were. Repeats alternate (old, new, old, ...) so
drift hits both alike. Printed per shape: the median and minimum ms per batch of each side, their ratio
(new / old, below 1 is faster) and the host syncs one call of each makes, counted by tests/host_syncs.py (each
one a stall of the step on a GPU, where the CPU figures here say nothing about the GPU's time).

    .venv/bin/python benchmarks/strong_views.py [--repeats 7] [--shapes 32x96,16x224,16x448] [--threads N]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from host_syncs import counting_syncs

from raybench.data.augment import ImageViews, cutout, random_shift_crop

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as the WILDS image datasets use


# --- OLD: what raybench/data/augment.py changed when RandAugment was batched (copied verbatim, renamed; the
# shift crop and Cutout did not change and are today's) ---------------------------------------------------


def old_normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x.float().div_(255.0) - m) / s


def old_random_flip(x: Tensor) -> Tensor:
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    out = x.clone()
    out[flip] = x[flip].flip(-1)
    return out


class OldImageViews:
    def __init__(self, mean: Sequence[float], std: Sequence[float], crop_pad: int, flip: bool, cutout_size: int,
                 magnitude: int = 9) -> None:
        from torchvision.transforms import v2

        self.mean, self.std = tuple(mean), tuple(std)
        self.crop_pad, self.flip, self.cutout_size = crop_pad, flip, cutout_size
        self.randaugment = v2.RandAugment(num_ops=2, magnitude=magnitude)

    def _weak_uint8(self, x: Tensor) -> Tensor:
        x = random_shift_crop(x, self.crop_pad)
        return old_random_flip(x) if self.flip else x

    def strong(self, x: Tensor) -> Tensor:
        x = self._weak_uint8(x)
        x = torch.stack([self.randaugment(img) for img in x])
        return old_normalize(cutout(x, self.cutout_size), self.mean, self.std)


# --- end of OLD ---------------------------------------------------------------------------------------------


def ms_per_batch(strong: Callable[[Tensor], Tensor], x: Tensor, batches: int) -> float:
    started = time.perf_counter()
    for _ in range(batches):
        strong(x)
    return (time.perf_counter() - started) * 1000 / batches


def syncs_per_call(strong: Callable[[Tensor], Tensor], x: Tensor) -> int:
    with counting_syncs() as counter:
        strong(x)
    return counter.total


def compare(batch: int, size: int, repeats: int, batches: int) -> dict[str, float]:
    """Alternating timed repeats of both sides on one random batch (after one untimed warm-up call each)."""
    x = torch.randint(0, 256, (batch, 3, size, size), generator=torch.Generator().manual_seed(size),
                      dtype=torch.uint8)
    pad, cut = max(1, size // 32), max(2, size // 4)
    sides = {"old": OldImageViews(MEAN, STD, pad, True, cut).strong, "new": ImageViews(MEAN, STD, pad, True, cut).strong}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for strong in sides.values():
        strong(x)
    for _ in range(repeats):
        for name, strong in sides.items():
            times[name].append(ms_per_batch(strong, x, batches))
    row = {f"{name}_{stat.__name__}": stat(t) for name, t in times.items() for stat in (statistics.median, min)}
    row.update({f"{name}_syncs": syncs_per_call(strong, x) for name, strong in sides.items()})
    row["ratio"] = row["new_median"] / row["old_median"]
    return row


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(s)) for b, s in (part.split("x") for part in text.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=3, help="batches per timed repeat")
    parser.add_argument("--shapes", default="32x96,16x224,16x448", help="BATCHxSIZE, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.repeats} alternating repeats of {args.batches} batches")
    print(f"{'batch x px':>11} | {'old ms (median/min)':>20} | {'new ms (median/min)':>20} | {'new/old':>7} | "
          f"{'syncs/call old':>14} | {'new':>3}")
    for batch, size in parse_shapes(args.shapes):
        r = compare(batch, size, args.repeats, args.batches)
        print(f"{batch:>4} x {size:<4} | {r['old_median']:>10.1f} / {r['old_min']:<7.1f} | "
              f"{r['new_median']:>10.1f} / {r['new_min']:<7.1f} | {r['ratio']:>7.2f} | "
              f"{r['old_syncs']:>14} | {r['new_syncs']:>3}", flush=True)


if __name__ == "__main__":
    main()
