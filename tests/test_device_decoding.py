"""image_decoding=device on the real WILDS data path: the host threads read JPEG bytes, `move_to` decodes them.

Everything runs on the exact-format fixtures with download=False and decodes on the CPU (`decoding_on(cpu)`);
the GPU path is the same code with a CUDA device (nvJPEG inside `decode_jpeg`).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.transforms.v2 import functional as TF

from raybench.data import load_dataset
from raybench.data.base import InputReadError, move_to
from raybench.data.prefetch import pinned
from raybench.data.wilds.adapter import SPECS, STORED_AS, EncodedImages, jpeg_folders, resize_like_pil
from raybench.trainer.loop import predict_split
from tests.wilds_fixtures import camelyon17 as camelyon17_fixture
from tests.wilds_fixtures import iwildcam as iwildcam_fixture

CPU = torch.device("cpu")
# What `resize_like_pil`'s docstring states: the device path is within one intensity level of PIL's, and off
# by one in well under 1% of the values.
MAX_LEVELS = 1
MEAN_LEVELS = 0.01
FRAME_MAX_LEVELS = 2  # full-size camera frames of sharp 4 px blocks: a few values 2 levels off


@pytest.fixture
def wilds_root(tmp_path, monkeypatch):
    iwildcam_fixture.write(tmp_path)
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(tmp_path))
    return tmp_path


def differences(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    d = (a.int() - b.int()).abs()
    return int(d.max()), float(d.float().mean())


@pytest.mark.parametrize("size", [None, 32])  # 448 (the fixture's 64 x 48 enlarged) and 32 (shrunk)
def test_device_decoding_gives_the_host_images_within_a_level(size, wilds_root):
    host = load_dataset("iwildcam")
    host = host if size is None else host.at_input_size(size)
    device = host.decoding_on(CPU)
    for name, split in host.splits.items():
        ids = torch.arange(len(split))
        expected = split.x[ids]
        got = move_to(device.splits[name].x[ids], CPU)
        assert got.dtype == torch.uint8 and got.shape == expected.shape, name
        worst, mean = differences(got, expected)
        assert worst <= MAX_LEVELS and mean <= MEAN_LEVELS, (name, worst, mean)


def test_the_input_size_applies_before_or_after_decoding_on(wilds_root):
    dataset = load_dataset("iwildcam")
    ids = torch.arange(4)
    before = dataset.at_input_size(32).decoding_on(CPU).splits["train"].x[ids]
    after = dataset.decoding_on(CPU).at_input_size(32).splits["train"].x[ids]
    assert isinstance(before, EncodedImages) and isinstance(after, EncodedImages)
    assert torch.equal(move_to(before, CPU), move_to(after, CPU)) and before.size == (32, 32)


def blocky(height: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (3, (height + 3) // 4, (width + 3) // 4), generator=g, dtype=torch.uint8)
    return blocks.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, :height, :width].contiguous()


# iWildCam's camera frames (height, width) as WILDS resizes them to 448, and odd shapes either way.
@pytest.mark.parametrize("shape, size", [((1536, 2048), (448, 448)), ((1080, 1920), (448, 448)),
                                         ((48, 64), (448, 448)), ((90, 70), (33, 21)), ((21, 33), (70, 90))])
def test_the_device_resize_matches_pil_within_the_stated_levels(shape, size):
    image = blocky(*shape, seed=sum(shape))
    expected = TF.pil_to_tensor(TF.to_pil_image(image).resize((size[1], size[0])))
    got = resize_like_pil(image[None], size)[0]
    worst, mean = differences(got, expected)
    assert got.shape == expected.shape and worst <= FRAME_MAX_LEVELS and mean <= MEAN_LEVELS, (worst, mean)


def test_a_split_read_then_moved_is_the_uint8_batch_the_views_take(wilds_root):
    split = load_dataset("iwildcam").decoding_on(CPU).splits["train"]
    batch = split.x[torch.tensor([3, 0, 7])]
    assert isinstance(batch, EncodedImages) and len(batch) == 3
    assert pinned(batch) is batch  # decode_jpeg takes pageable CPU bytes: nothing to pin
    images = move_to(batch, CPU)
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 448, 448)
    assert torch.equal(move_to(batch[1:2], CPU), images[1:2])  # a batch's rows are its inputs too
    assert torch.equal(split.take(torch.tensor([3, 0, 7])).to(CPU).x, images)


def test_evaluation_reads_the_encoded_split_unchanged(wilds_root):
    host = load_dataset("iwildcam").at_input_size(32)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 5))
    expected = predict_split(model, host.splits["val"], host.views.plain, CPU, batch_size=3)
    got = predict_split(model, host.decoding_on(CPU).splits["val"], host.views.plain, CPU, batch_size=3)
    assert got.shape == expected.shape == (len(host.splits["val"]), 5)
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0)


@pytest.mark.parametrize("damage", ["truncated", "not a jpeg", "empty"])
def test_a_corrupt_jpeg_is_an_input_read_error_naming_the_file(damage, wilds_root):
    split = load_dataset("iwildcam").decoding_on(CPU).splits["train"]
    batch = split.x[torch.arange(4)]
    bad = batch.files[2]
    data = Path(bad).read_bytes()
    Path(bad).write_bytes({"truncated": data[: len(data) // 3], "not a jpeg": b"<html>404</html>", "empty": b""}[damage])
    with pytest.raises(InputReadError) as err:
        move_to(split.x[torch.arange(4)], CPU)
    message = str(err.value)
    assert bad in message and "\n" not in message and ".cpp" not in message, message


def test_a_missing_jpeg_is_an_input_read_error_naming_the_file(wilds_root):
    split = load_dataset("iwildcam").decoding_on(CPU).splits["train"]
    gone = split.x[torch.arange(2)].files[1]
    Path(gone).unlink()
    with pytest.raises(InputReadError, match="cannot read") as err:
        split.x[torch.arange(2)]
    assert gone in str(err.value) and "\n" not in str(err.value)


def test_a_png_dataset_is_refused_in_one_line(tmp_path, monkeypatch):
    camelyon17_fixture.write(tmp_path)
    camelyon17_fixture.patched_unlabeled_class(monkeypatch)
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(tmp_path))
    with pytest.raises(ValueError) as err:
        load_dataset("camelyon17").decoding_on(CPU)
    message = str(err.value)
    assert "'camelyon17'" in message and "PNG" in message and "JPEG" in message and "\n" not in message


def test_every_wilds_image_dataset_declares_how_its_files_are_stored():
    images = {name for name, spec in SPECS.items() if spec.inputs in ("image", "detection")}
    assert images == set(STORED_AS)
    with pytest.raises(ValueError, match=r"^dataset 'poverty' reads multispectral inputs, not encoded image files"):
        jpeg_folders("poverty", SPECS["poverty"].inputs)


def test_the_digits_dataset_is_refused_in_one_line(shared_data_dir):
    with pytest.raises(ValueError) as err:
        load_dataset("digits-shift", shared_data_dir).decoding_on(CPU)
    message = str(err.value)
    assert "'digits-shift'" in message and "decoded in memory" in message and "\n" not in message


def test_a_device_without_a_jpeg_decoder_is_refused_in_one_line(wilds_root):
    with pytest.raises(ValueError, match="not 'meta'"):
        load_dataset("iwildcam").decoding_on(torch.device("meta"))
