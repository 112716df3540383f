"""The batched RandAugment of raybench.data.augment gives the views torchvision's per-image RandAugment gives,
without a host sync: same op and sign distribution, the same result op for op, the same whole-view statistics on
real images, and seeded runs that repeat."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from host_syncs import counting_syncs, summary
from torchvision.transforms import v2

from raybench.data.augment import (
    NUM_MAGNITUDE_BINS,
    OP_INDEX,
    RANDAUGMENT_OPS,
    SIGNED_OPS,
    BatchedRandAugment,
    ImageViews,
    translate_pixels,
)
from raybench.data.digits_shift import load_base_digits

# Chi-square critical values at p = 0.001 (a correct sampler fails once in a thousand seeds; the seed is fixed).
CHI2_CRIT_DF13 = 34.53
CHI2_CRIT_DF195 = 258.0


def _chi_square(counts: torch.Tensor) -> float:
    expected = counts.sum() / counts.numel()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def test_op_choice_is_uniform_with_replacement_per_image() -> None:
    """Each of the 14 ops equally likely in each slot, the two slots independent and possibly the same op
    (torchvision draws with replacement): chi-square over the 14 ops and over the 196 ordered pairs."""
    torch.manual_seed(0)
    ops, _ = BatchedRandAugment().draw(28_000, torch.device("cpu"))
    k = len(RANDAUGMENT_OPS)
    assert k == 14
    for slot in ops:
        assert _chi_square(torch.bincount(slot, minlength=k)) < CHI2_CRIT_DF13
    pairs = torch.bincount(ops[0] * k + ops[1], minlength=k * k)
    assert _chi_square(pairs) < CHI2_CRIT_DF195
    assert pairs.view(k, k).diagonal().min() > 0  # the same op twice happens


def test_sign_flips_half_the_time() -> None:
    """`rand <= 0.5` per slot: the negative fraction within 4 binomial standard deviations of 1/2."""
    torch.manual_seed(1)
    n = 20_000
    _, negative = BatchedRandAugment().draw(n, torch.device("cpu"))
    bound = 4 * math.sqrt(0.25 / n)
    for slot in negative:
        assert abs(slot.double().mean().item() - 0.5) < bound


def _test_images(channels: int, height: int, width: int) -> torch.Tensor:
    """Random pixels, plus the cases with their own branches: a flat image (AutoContrast/Equalize leave it), an
    image of few levels, and one with a single off pixel (Equalize's step 0)."""
    g = torch.Generator().manual_seed(height * 1000 + width + channels)
    x = torch.randint(0, 256, (6, channels, height, width), generator=g, dtype=torch.uint8)
    x[0] = 7
    x[1] = (x[1] // 64) * 50 + 3
    x[2] = 200
    x[2, :, 0, 0] = 10
    return x


def _torchvision_op(name: str, negative: bool, image: torch.Tensor, ra: v2.RandAugment) -> torch.Tensor:
    """torchvision's RandAugment op `name` at bin 9 and the given sign, on one image (its own code path)."""
    height, width = image.shape[-2:]
    magnitudes_fn, signed = ra._AUGMENTATION_SPACE[name]
    magnitudes = magnitudes_fn(ra.num_magnitude_bins, height, width)
    magnitude = float(magnitudes[ra.magnitude]) if magnitudes is not None else 0.0
    if signed and negative:
        magnitude = -magnitude
    return ra._apply_image_or_video_transform(image, name, magnitude, interpolation=ra.interpolation, fill=ra._fill)


@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 23, 41), (1, 20, 17)])
@pytest.mark.parametrize("name", RANDAUGMENT_OPS)
def test_each_op_equals_torchvisions_on_each_image(name: str, shape: tuple[int, int, int]) -> None:
    """Exactly equal, not within a tolerance: the geometric maps are torchvision's grids sampled once, and the
    colour ops use its float32 operations with its scalar factors, so even the rounding agrees on a CPU."""
    ra, ours = v2.RandAugment(num_ops=2, magnitude=9), BatchedRandAugment(num_ops=2, magnitude=9)
    x = _test_images(*shape)
    for negative in (False, True) if name in SIGNED_OPS else (False,):
        ops = torch.full((1, len(x)), OP_INDEX[name])
        got = ours.apply(x, ops, torch.full((1, len(x)), negative))
        want = torch.stack([_torchvision_op(name, negative, image, ra) for image in x])
        assert got.dtype == torch.uint8
        assert torch.equal(got, want), f"{name} negative={negative}: {(got != want).sum()} values differ"


def test_mixed_ops_in_one_batch_equal_torchvisions_chain() -> None:
    """Each image keeps its own two ops, in order (the second op sees the first op's output)."""
    ra, ours = v2.RandAugment(num_ops=2, magnitude=9), BatchedRandAugment()
    x = torch.randint(0, 256, (56, 3, 24, 24), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    k = len(RANDAUGMENT_OPS)
    ops = torch.stack([torch.arange(56) % k, (torch.arange(56) * 5 + 3) % k])
    negative = torch.stack([torch.arange(56) % 2 == 0, torch.arange(56) % 3 == 0])
    got = ours.apply(x, ops, negative)
    for i, image in enumerate(x):
        for slot in range(2):
            image = _torchvision_op(RANDAUGMENT_OPS[int(ops[slot, i])], bool(negative[slot, i]), image, ra)
        assert torch.equal(got[i], image), f"image {i}"


def test_translation_is_torchvisions_whole_pixels_at_every_size_and_bin() -> None:
    """The float32 linspace value truncated, as torchvision's `int(magnitude)`, without reading a tensor."""
    for size in range(1, 700):
        want = torch.linspace(0.0, 150.0 / 331.0 * size, NUM_MAGNITUDE_BINS).tolist()
        assert [translate_pixels(size, m) for m in range(NUM_MAGNITUDE_BINS)] == [int(v) for v in want], size


def _digit_images(n: int) -> torch.Tensor:
    """sklearn's digits upsampled to 20x20 and tinted per channel, so the colour ops see unequal channels."""
    images, _ = load_base_digits()
    x = F.interpolate(images[:n].unsqueeze(1), size=(20, 20), mode="bilinear", align_corners=False)
    tint = torch.tensor([1.0, 0.75, 0.4]).view(1, 3, 1, 1)
    return (x * tint * 255 + 20).clamp(0, 255).to(torch.uint8)


def test_whole_views_of_real_images_match_torchvisions_statistics() -> None:
    """Per-channel mean and std over 700 views (digits, each augmented once by each path) agree within 4 standard
    errors of the per-image means and stds, estimated from the views themselves. 20x20 keeps it fast and above
    255 pixels, the size below which Equalize leaves an image as it is; at this size the test goes red when the
    sign never flips, when only one op is applied, or when Equalize or Solarize is dropped."""
    x = _digit_images(700)
    ra = v2.RandAugment(num_ops=2, magnitude=9)
    torch.manual_seed(5)
    old = torch.stack([ra(image) for image in x]).float()
    new = BatchedRandAugment()(x).float()
    for stat in (lambda v: v.mean(dim=(2, 3)), lambda v: v.std(dim=(2, 3))):
        per_old, per_new = stat(old), stat(new)  # (images, channels)
        se = torch.sqrt((per_old.var(dim=0) + per_new.var(dim=0)) / len(x))
        gap = (per_old.mean(dim=0) - per_new.mean(dim=0)).abs()
        assert (gap < 4 * se).all(), f"gap {gap.tolist()} vs 4 SE {(4 * se).tolist()}"


@pytest.mark.parametrize("flip", [False, True])
def test_strong_and_weak_views_make_no_host_sync(flip: bool) -> None:
    """Counted from the first call on: the per-size tables are built from Python floats, not read from tensors."""
    views = ImageViews((0.5,) * 3, (0.25,) * 3, crop_pad=2, flip=flip, cutout_size=6)
    x = _test_images(3, 19, 21)
    with counting_syncs() as counter:
        for _ in range(2):
            views.strong(x)
            views.weak(x)
    assert counter.total == 0, summary(counter.by_site)


@pytest.mark.parametrize("view", ["strong", "randaugment"])
def test_seeded_strong_views_repeat_and_seeds_differ(view: str) -> None:
    """The whole strong view, and its RandAugment alone (crop, flip and cutout would hide a RandAugment that
    ignored the seed), follow the global torch RNG that the trainer seeds."""
    views = ImageViews((0.5,) * 3, (0.5,) * 3, crop_pad=2, flip=True, cutout_size=6)
    x = _digit_images(32)

    def seeded(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return getattr(views, view)(x)

    assert torch.equal(seeded(11), seeded(11))
    assert not torch.equal(seeded(11), seeded(12))


def test_a_call_is_the_drawn_ops_applied() -> None:
    """`__call__` applies exactly what `draw` gives from the same RNG state (so the distribution tests above speak
    for the views)."""
    aug, x = BatchedRandAugment(), _digit_images(40)
    torch.manual_seed(2)
    called = aug(x)
    torch.manual_seed(2)
    ops, negative = aug.draw(len(x), x.device)
    assert torch.equal(called, aug.apply(x, ops, negative))
