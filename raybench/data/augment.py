"""Input views for image datasets, following WILDS 2.0 App. C.

weak = random crop (reflect-padded shift) and, where the labels allow it, horizontal flip;
strong = weak + RandAugment(2 ops) + Cutout. Views take a uint8 batch (N, C, H, W) and return the
normalised float batch, so datasets stay compact in memory and every algorithm shares one pipeline.
RandAugment is torchvision's; it draws one op set per call, so it is applied per example.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.data.base import Views


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x.float().div_(255.0) - m) / s


def random_shift_crop(x: Tensor, pad: int) -> Tensor:
    """Per-example random crop of the reflect-padded batch back to its size (a shift by up to `pad`)."""
    if pad <= 0:
        return x
    n, _, h, w = x.shape
    padded = F.pad(x.float(), (pad, pad, pad, pad), mode="reflect")
    dev = x.device
    dy = torch.randint(0, 2 * pad + 1, (n,), device=dev)
    dx = torch.randint(0, 2 * pad + 1, (n,), device=dev)
    rows = (dy.view(n, 1) + torch.arange(h, device=dev).view(1, h)).view(n, 1, h, 1).expand(n, x.shape[1], h, w + 2 * pad)
    cropped = padded.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(w, device=dev).view(1, w)).view(n, 1, 1, w).expand(n, x.shape[1], h, w)
    return cropped.gather(3, cols).to(x.dtype)


def random_flip(x: Tensor) -> Tensor:
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    out = x.clone()
    out[flip] = x[flip].flip(-1)
    return out


def cutout(x: Tensor, size: int) -> Tensor:
    """DeVries & Taylor (2017): zero one `size` x `size` square per example, centred anywhere (may be clipped)."""
    n, _, h, w = x.shape
    dev = x.device
    cy = torch.randint(0, h, (n, 1, 1), device=dev)
    cx = torch.randint(0, w, (n, 1, 1), device=dev)
    ys = torch.arange(h, device=dev).view(1, h, 1)
    xs = torch.arange(w, device=dev).view(1, 1, w)
    inside = ((ys - cy).abs() <= size // 2) & ((xs - cx).abs() <= size // 2)
    return x.masked_fill(inside.unsqueeze(1), 0)


class ImageViews:
    """Builds the plain/weak/strong views for uint8 RGB images of one dataset."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], crop_pad: int, flip: bool, cutout_size: int,
                 magnitude: int = 9) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self.crop_pad, self.flip, self.cutout_size = crop_pad, flip, cutout_size
        self.magnitude = magnitude

    @cached_property
    def randaugment(self) -> Any:
        """torchvision's RandAugment, built on first use: importing torchvision costs seconds in every Ray
        worker, and most runs (no strong view) never need it."""
        from torchvision.transforms import v2

        return v2.RandAugment(num_ops=2, magnitude=self.magnitude)

    def plain(self, x: Tensor) -> Tensor:
        return normalize(x, self.mean, self.std)

    def _weak_uint8(self, x: Tensor) -> Tensor:
        x = random_shift_crop(x, self.crop_pad)
        return random_flip(x) if self.flip else x

    def weak(self, x: Tensor) -> Tensor:
        return normalize(self._weak_uint8(x), self.mean, self.std)

    def strong(self, x: Tensor) -> Tensor:
        x = self._weak_uint8(x)
        x = torch.stack([self.randaugment(img) for img in x])
        return normalize(cutout(x, self.cutout_size), self.mean, self.std)

    def as_views(self) -> Views:
        return Views(plain=self.plain, weak=self.weak, strong=self.strong)
