"""Shuffled index batches over in-memory splits, driven by an explicit generator for reproducibility."""
from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor


def epoch_batches(n: int, batch_size: int, generator: torch.Generator, drop_last: bool = True) -> Iterator[Tensor]:
    """One shuffled pass over `n` examples; the last short batch is dropped so batch norm sees full batches."""
    order = torch.randperm(n, generator=generator)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    for start in range(0, stop, batch_size):
        yield order[start:start + batch_size]


def cycle_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless shuffled batches, reshuffling at each pass: the unlabeled stream cycled beside the labeled one."""
    if batch_size > n:
        raise ValueError(f"unlabeled batch of {batch_size} is larger than the unlabeled split ({n})")
    while True:
        yield from epoch_batches(n, batch_size, generator)


def steps_per_epoch(n: int, batch_size: int, cap: int | None) -> int:
    steps = max(n // batch_size, 1)
    return min(steps, cap) if cap else steps
