"""Shuffled index batches over in-memory splits, driven by an explicit generator for reproducibility."""
from __future__ import annotations

from collections.abc import Iterator

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


def balanced_batches(keys: Tensor, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Batches with equal counts of every key (class or group); B mod K extra slots go to random keys.

    Each key's examples are drawn without replacement in a fresh random order, restarting when used
    up, so a small group is cycled through completely before any of its examples repeats.
    """
    members = [torch.nonzero(keys == k).flatten() for k in torch.unique(keys)]
    streams = [_endless(m, generator) for m in members]
    share, extra = divmod(batch_size, len(members))
    for _ in range(steps):
        counts = [share] * len(members)
        for k in torch.randperm(len(members), generator=generator)[:extra].tolist():
            counts[k] += 1
        yield torch.tensor([next(streams[k]) for k, c in enumerate(counts) for _ in range(c)], dtype=torch.long)


ENDLESS_CHUNK = 4096  # indices turned into Python ints at a time


def _endless(members: Tensor, generator: torch.Generator) -> Iterator[int]:
    """`members` in a fresh random order per pass, as ints. Iterating the permuted tensor itself would unbind
    it into one tensor object per element at once: for JTT's multiset (the error set repeated S_r times,
    tens of millions of indices) that is gigabytes before the first batch."""
    while True:
        order = members[torch.randperm(len(members), generator=generator)]
        for start in range(0, len(order), ENDLESS_CHUNK):
            yield from order[start:start + ENDLESS_CHUNK].tolist()


def weighted_batches(weights: Tensor, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Importance sampling with replacement: example i is drawn with probability weights[i] / sum(weights)."""
    draws = torch.multinomial(weights.double(), steps * batch_size, replacement=True, generator=generator)
    yield from draws.view(steps, batch_size)


def multiset_batches(indices: Tensor, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """An upsampled multiset of indices in a fresh random order, cycled if the epoch asks for more."""
    stream = _endless(indices, generator)
    for _ in range(steps):
        yield torch.tensor([next(stream) for _ in range(batch_size)], dtype=torch.long)
