"""Input views for image datasets, following WILDS 2.0 App. C.

weak = random crop (reflect-padded shift) and, where the labels allow it, horizontal flip;
strong = weak + RandAugment(2 ops) + Cutout. Views take a uint8 batch (N, C, H, W) and return the
normalised float batch, so datasets stay compact in memory and every algorithm shares one pipeline.

Every view runs inside the training step on the batch's device, so none of them may make the host wait for it.
torchvision's RandAugment draws its op set with a host read per op (`int(torch.randint(...))`,
`torch.rand(()) <= 0.5`) and runs on one image at a time: about 70 host reads and hundreds of tiny kernel launches
per batch, each a stall on a GPU. `BatchedRandAugment` is one call per batch instead: the per-image op choices
and signs are tensors drawn on the batch's device from the global torch RNG (seeded runs stay reproducible), every
op is computed for the whole batch and `torch.where` keeps, per image, the one it drew (a boolean-mask index would
have a data-dependent shape, hence a sync).

What matches torchvision's `v2.RandAugment(num_ops=2, magnitude=9)` (defaults: nearest, fill 0): the 14 ops and
their order, a uniform choice with replacement of each op, the magnitude bin (`magnitude` of 31 bins, read from
the same linspaces), the 50 % sign flip of the signed ops, uint8 in and out, and each op's arithmetic. The five
geometric ops are torchvision's own affine grids (same centres, shear and rotation conventions, translation
truncated to whole pixels) turned once per image size and device into source-pixel maps, so a batch of them is
one gather; Brightness, Color, Contrast and Sharpness are torchvision's blends with per-image float32 factors,
rounded as its own; AutoContrast, Equalize (per-image per-channel 256-bin histograms by scatter_add), Posterize
and Solarize are its formulas on the whole batch. On a CPU every op equals torchvision's bit for bit (the tests
hold it so). The price: each op slot computes all 14 ops for every image, where the per-image path computes one,
so on a CPU with large images this is slower; on a GPU each op is a few memory-bound kernels over the batch.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.data.base import Views

# torchvision's RandAugment op space, in its order: the op index drawn per image points into this tuple.
RANDAUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                   "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
SIGNED_OPS = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                        "Contrast", "Sharpness"})
GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
OP_INDEX = {name: i for i, name in enumerate(RANDAUGMENT_OPS)}
NUM_MAGNITUDE_BINS = 31


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    m, s = _mean_std(tuple(mean), tuple(std), x.device)
    return (x.float().div_(255.0) - m) / s


@lru_cache(maxsize=32)
def _mean_std(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """Kept per device: building them each step would be a pageable host-to-device copy, which waits for the GPU."""
    m = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return m, s


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
    """Horizontal flip of each example with probability 1/2, selected with `where` (a mask index would sync)."""
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)


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


# --- RandAugment's magnitudes, read as torchvision reads them -------------------------------------------------


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def translate_pixels(size: int, magnitude: int, num_bins: int = NUM_MAGNITUDE_BINS) -> int:
    """`int(float(torch.linspace(0, 150/331 * size, num_bins)[magnitude]))` in float32, without a tensor: the
    table is built inside the step, where reading a tensor on the host would be a sync. Its float32 rounding is
    linspace's scalar formula; the test holds it to torchvision's value over many sizes and every bin."""
    end = _f32(150.0 / 331.0 * size)
    step = _f32(end / (num_bins - 1))
    if magnitude < num_bins // 2:
        return int(_f32(step * magnitude))
    return int(_f32(end - _f32(step * (num_bins - 1 - magnitude))))


@dataclass(frozen=True)
class Levels:
    """The unsigned magnitudes of RandAugment's bin `magnitude`, as the Python floats torchvision passes its ops."""

    magnitude: int
    shear: float
    rotate: float
    enhance: float
    posterize_bits: int
    solarize: float

    @classmethod
    def of_bin(cls, magnitude: int, num_bins: int = NUM_MAGNITUDE_BINS) -> Levels:
        if not 0 <= magnitude < num_bins:
            raise ValueError(f"RandAugment magnitude must be a bin in [0, {num_bins - 1}], got {magnitude}")
        bits = (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round().int()
        return cls(magnitude=magnitude,
                   shear=float(torch.linspace(0.0, 0.3, num_bins)[magnitude]),
                   rotate=float(torch.linspace(0.0, 30.0, num_bins)[magnitude]),
                   enhance=float(torch.linspace(0.0, 0.9, num_bins)[magnitude]),
                   posterize_bits=int(bits[magnitude]),
                   solarize=float(torch.linspace(1.0, 0.0, num_bins)[magnitude]))

    def signed(self, op: str, negative: bool, height: int, width: int) -> float:
        """The magnitude torchvision gives `op` once its sign is drawn."""
        value = {"ShearX": self.shear, "ShearY": self.shear, "Rotate": self.rotate,
                 "TranslateX": float(translate_pixels(width, self.magnitude)),
                 "TranslateY": float(translate_pixels(height, self.magnitude))}.get(op, self.enhance)
        return -value if negative else value


# --- The geometric ops: torchvision's affine grids, as source-pixel maps -------------------------------------


def inverse_affine_matrix(center: Sequence[float], angle: float, translate: Sequence[float],
                          shear: Sequence[float]) -> list[float]:
    """torchvision's `_get_inverse_affine_matrix` at scale 1 (same operations, so the same float64 values)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy, tan_sx, rot_minus_sy = math.cos(sy), math.tan(sx), rot - sy
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix[2] += cx - matrix[0] * (cx + tx) - matrix[1] * (cy + ty)
    matrix[5] += cy - matrix[3] * (cx + tx) - matrix[4] * (cy + ty)
    return matrix


def geometric_matrix(op: str, magnitude: float, height: int, width: int) -> list[float]:
    """The inverse matrix torchvision's RandAugment builds for `op` at a signed magnitude: shears turn about the
    top-left corner (`center=[0, 0]`), translations move by whole pixels (`int`), rotations turn about the centre
    by `-(angle % 360)`."""
    corner = [-width * 0.5, -height * 0.5]
    if op == "ShearX":
        return inverse_affine_matrix(corner, 0.0, [0.0, 0.0], [math.degrees(math.atan(magnitude)), 0.0])
    if op == "ShearY":
        return inverse_affine_matrix(corner, 0.0, [0.0, 0.0], [0.0, math.degrees(math.atan(magnitude))])
    if op == "TranslateX":
        return inverse_affine_matrix([0.0, 0.0], 0.0, [float(int(magnitude)), 0.0], [0.0, 0.0])
    if op == "TranslateY":
        return inverse_affine_matrix([0.0, 0.0], 0.0, [0.0, float(int(magnitude))], [0.0, 0.0])
    if op == "Rotate":
        return inverse_affine_matrix([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], [0.0, 0.0])
    raise ValueError(f"{op} is not a geometric op")


def _affine_grid(theta: Tensor, height: int, width: int) -> Tensor:
    """torchvision's `_affine_grid` (output size = input size), step for step."""
    dtype, device = theta.dtype, theta.device
    base_grid = torch.empty(1, height, width, 3, dtype=dtype, device=device)
    base_grid[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device))
    rows = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device).unsqueeze_(-1)
    base_grid[..., 1].copy_(rows)
    base_grid[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * width, 0.5 * height], dtype=dtype, device=device))
    return base_grid.view(1, height * width, 3).bmm(rescaled).view(1, height, width, 2)


def _source_pixels(matrix: list[float], height: int, width: int, device: torch.device) -> Tensor:
    """Flat index of the pixel nearest-neighbour `grid_sample` reads for each output pixel, -1 outside the image
    (filled with 0). Sampling an image of pixel numbers with the same grid gives exactly the pixel it would pick."""
    theta = torch.tensor(matrix, dtype=torch.float32, device=device).reshape(1, 2, 3)
    numbers = torch.arange(1, height * width + 1, dtype=torch.float32, device=device).view(1, 1, height, width)
    picked = F.grid_sample(numbers, _affine_grid(theta, height, width), mode="nearest", padding_mode="zeros",
                           align_corners=False)
    return picked.round_().long().view(height * width) - 1


@dataclass(frozen=True)
class GeometricMaps:
    """Per image size and device: entry 0 the identity, then each geometric op at + and - magnitude.
    `entry[op, negative]` names the map an image with that draw uses (0 for the non-geometric ops)."""

    source: Tensor  # (entries, H*W) long, clamped to a valid pixel
    inside: Tensor  # (entries, H*W) bool, False where torchvision fills 0
    entry: Tensor  # (len(RANDAUGMENT_OPS), 2) long


@lru_cache(maxsize=16)
def geometric_maps(levels: Levels, height: int, width: int, device: torch.device) -> GeometricMaps:
    identity = torch.arange(height * width, device=device)
    maps, entry = [identity], torch.zeros(len(RANDAUGMENT_OPS), 2, dtype=torch.long)
    for op in GEOMETRIC_OPS:
        for negative in (False, True):
            entry[OP_INDEX[op], int(negative)] = len(maps)
            matrix = geometric_matrix(op, levels.signed(op, negative, height, width), height, width)
            maps.append(_source_pixels(matrix, height, width, device))
    source = torch.stack(maps)
    return GeometricMaps(source=source.clamp(min=0), inside=source >= 0, entry=entry.to(device))


def gather_pixels(x: Tensor, source: Tensor, inside: Tensor) -> Tensor:
    """Output pixel p of image i is x[i, :, source[i, p]] (0 where not `inside`): one gather for the batch."""
    n, c, h, w = x.shape
    picked = x.flatten(2).gather(2, source.unsqueeze(1).expand(n, c, h * w))
    return picked.masked_fill_(~inside.unsqueeze(1), 0).view(n, c, h, w)


# --- The colour ops: torchvision's arithmetic on the whole batch ---------------------------------------------


def _to_uint8(x: Tensor) -> Tensor:
    return x.clamp_(0, 255).to(torch.uint8)


@dataclass(frozen=True)
class Factor:
    """A per-image blend factor (N, 1, 1, 1) and its complement, each the float32 rounding of torchvision's
    float64 `ratio` and `1.0 - ratio`. `a.addcmul(b, complement)` rounds once, as torchvision's
    `a.add_(b, alpha=1 - ratio)` does (fused multiply-add on a CPU), so per-image factors keep its results."""

    ratio: Tensor
    complement: Tensor

    @classmethod
    def signed(cls, negative: Tensor, magnitude: float) -> Factor:
        plus, minus = 1.0 + magnitude, 1.0 - magnitude
        return cls(torch.where(negative, minus, plus), torch.where(negative, 1.0 - minus, 1.0 - plus))


def _blend(image: Tensor, other: Tensor, factor: Factor) -> Tensor:
    """torchvision's `_blend` for uint8 images, with a factor per image."""
    return _to_uint8(image.mul(factor.ratio).addcmul_(other, factor.complement))


def _grayscale(xf: Tensor) -> Tensor:
    """Floored luma, as torchvision's Color and Contrast take it from a uint8 image."""
    if xf.shape[1] == 1:
        return xf
    r, g, b = xf.unbind(dim=1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).floor_().unsqueeze(1)


def brightness(xf: Tensor, factor: Factor) -> Tensor:
    return _to_uint8(xf.mul(factor.ratio))


def color(x: Tensor, xf: Tensor, gray: Tensor, factor: Factor) -> Tensor:
    """Saturation: a blend towards the luma (a one-channel image has none to change, as in torchvision)."""
    return x if x.shape[1] == 1 else _blend(xf, gray, factor)


def contrast(xf: Tensor, gray: Tensor, factor: Factor) -> Tensor:
    return _blend(xf, gray.mean(dim=(-3, -2, -1), keepdim=True), factor)


def sharpness_blur(xf: Tensor) -> Tensor:
    """torchvision's rounded 3x3 smoothing (1s round a 5, over 13) of the interior, as (3x3 sum + 4 centre) / 13:
    the sums of whole intensities are exact, and (integer / 13) is never within float32 error of a half, so the
    rounded blur equals torchvision's rounded conv2d (a grouped conv, many times slower on a CPU)."""
    rows = xf[..., :, :-2] + xf[..., :, 1:-1] + xf[..., :, 2:]
    box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]
    return box.add_(xf[..., 1:-1, 1:-1], alpha=4.0).div_(13.0).round_()


def sharpness(x: Tensor, xf: Tensor, blurred: Tensor, factor: Factor) -> Tensor:
    """Blends the interior towards the blur; the one-pixel border stays (torchvision's Sharpness)."""
    if x.shape[-1] <= 2 or x.shape[-2] <= 2:
        return x
    out = xf.clone()
    view = out[..., 1:-1, 1:-1]
    view.addcmul_(blurred.sub(view), factor.complement)
    return _to_uint8(out)


def posterize(x: Tensor, bits: int) -> Tensor:
    return x if bits >= 8 else x & (((1 << bits) - 1) << (8 - bits))


def solarize(x: Tensor, threshold: float) -> Tensor:
    """Inverts the pixels at or above `threshold`; compared as uint8 with its ceiling (the same pixels, for whole
    intensities), which spares a float copy of the batch."""
    return torch.where(x >= math.ceil(threshold), 255 - x, x)


def autocontrast(x: Tensor, xf: Tensor) -> Tensor:
    """Per-image per-channel stretch to [0, 255]; flat channels are left as they are (where, not a mask index)."""
    minimum = xf.amin(dim=(-2, -1), keepdim=True)
    maximum = xf.amax(dim=(-2, -1), keepdim=True)
    flat = maximum == minimum
    inv_scale = maximum.sub_(minimum).mul_(1.0 / 255)
    minimum = torch.where(flat, 0.0, minimum)
    inv_scale = torch.where(flat, 1.0, inv_scale)
    return _to_uint8(xf.sub(minimum).div_(inv_scale))


def equalize(x: Tensor) -> Tensor:
    """PIL's histogram equalisation per image and channel, as torchvision computes it: a fixed 256-bin histogram
    per (image, channel) by scatter_add (bincount's output size would be read on the host)."""
    n, c, h, w = x.shape
    flat = x.flatten(2).long()
    hist = torch.zeros(n, c, 256, dtype=torch.int32, device=x.device)
    hist.scatter_add_(2, flat, torch.ones(1, dtype=torch.int32, device=x.device).expand_as(flat))
    cum_hist = hist.cumsum(dim=-1)
    last = cum_hist.argmax(dim=-1, keepdim=True)
    step = (h * w - hist.gather(2, last)).div_(255, rounding_mode="floor")
    valid = step.ne(0).unsqueeze(-1)
    lut = cum_hist[..., :-1].add(step // 2).div_(step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut], dim=-1).to(torch.uint8)
    return torch.where(valid, lut.gather(2, flat).view_as(x), x)


class BatchedRandAugment:
    """torchvision's `v2.RandAugment(num_ops, magnitude)` with the same distribution of views, in one call per
    uint8 batch (N, C, H, W) and without a host read: see the module docstring."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9) -> None:
        if num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative integer, got {num_ops}")
        self.num_ops = num_ops
        self.levels = Levels.of_bin(magnitude)

    def draw(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Per image and op slot: the op index (uniform, with replacement) and whether its sign flips (p = 1/2,
        `rand <= 0.5` as torchvision; ignored by the unsigned ops)."""
        ops = torch.randint(len(RANDAUGMENT_OPS), (self.num_ops, n), device=device)
        negative = torch.rand((self.num_ops, n), device=device) <= 0.5
        return ops, negative

    def __call__(self, x: Tensor) -> Tensor:
        ops, negative = self.draw(x.shape[0], x.device)
        return self.apply(x, ops, negative)

    def apply(self, x: Tensor, ops: Tensor, negative: Tensor) -> Tensor:
        """The ops `ops[k]` (signs `negative[k]`) applied in slot order k = 0, 1, ...: RandAugment's chain."""
        for op, neg in zip(ops, negative):
            x = self.apply_one(x, op, neg)
        return x

    def apply_one(self, x: Tensor, op: Tensor, negative: Tensor) -> Tensor:
        """Every op on the whole batch, each image keeping the one it drew (the geometric ones and Identity in
        one gather, each image through its own map)."""
        n, _, h, w = x.shape
        maps = geometric_maps(self.levels, h, w, x.device)
        chosen = maps.entry[op, negative.long()]
        out = gather_pixels(x, maps.source[chosen], maps.inside[chosen])
        for name, result in self._colour_ops(x, negative.view(n, 1, 1, 1)).items():
            out = torch.where((op == OP_INDEX[name]).view(n, 1, 1, 1), result, out)
        return out

    def _colour_ops(self, x: Tensor, negative: Tensor) -> dict[str, Tensor]:
        xf = x.float()
        gray = _grayscale(xf)
        factor = Factor.signed(negative, self.levels.enhance)
        blurred = sharpness_blur(xf) if min(x.shape[-2:]) > 2 else xf
        return {
            "Brightness": brightness(xf, factor),
            "Color": color(x, xf, gray, factor),
            "Contrast": contrast(xf, gray, factor),
            "Sharpness": sharpness(x, xf, blurred, factor),
            "Posterize": posterize(x, self.levels.posterize_bits),
            "Solarize": solarize(x, 255.0 * self.levels.solarize),
            "AutoContrast": autocontrast(x, xf),
            "Equalize": equalize(x),
        }


class ImageViews:
    """Builds the plain/weak/strong views for uint8 RGB images of one dataset."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], crop_pad: int, flip: bool, cutout_size: int,
                 magnitude: int = 9) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self.crop_pad, self.flip, self.cutout_size = crop_pad, flip, cutout_size
        self.magnitude = magnitude
        # Built here, not in the step: its magnitudes are read from torch.linspace on the host once.
        self.randaugment = BatchedRandAugment(num_ops=2, magnitude=magnitude)

    def plain(self, x: Tensor) -> Tensor:
        return normalize(x, self.mean, self.std)

    def _weak_uint8(self, x: Tensor) -> Tensor:
        x = random_shift_crop(x, self.crop_pad)
        return random_flip(x) if self.flip else x

    def weak(self, x: Tensor) -> Tensor:
        return normalize(self._weak_uint8(x), self.mean, self.std)

    def strong(self, x: Tensor) -> Tensor:
        x = self.randaugment(self._weak_uint8(x))
        return normalize(cutout(x, self.cutout_size), self.mean, self.std)

    def as_views(self) -> Views:
        return Views(plain=self.plain, weak=self.weak, strong=self.strong)
