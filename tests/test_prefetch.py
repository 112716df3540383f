"""The data path reads ahead without changing a single batch: order, streams, resumes, shutdown, bad files."""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.datasets import make_tiny_dataset
from helpers.paths import REPO

from raybench.data.base import InputReadError, ShiftDataset, Split
from raybench.data.prefetch import THREAD_PREFIX, Prefetcher
from raybench.trainer import Callback, EpochReport, TrainConfig, Trainer

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.wilds_fixtures import camelyon17 as camelyon17_fixture
from tests.wilds_fixtures import iwildcam as iwildcam_fixture


class DiskLikeInputs:
    """Tensors served like files read on demand: a batch per request, every request logged, optionally
    failing at request number `fail_at` (a disk error mid-epoch)."""

    def __init__(self, x: torch.Tensor, log: list, fail_at: int | None = None) -> None:
        self.x, self.log, self.fail_at = x, log, fail_at
        self.closed = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index):
        rows = torch.arange(len(self.x))[index] if isinstance(index, slice) else index
        self.log.append(rows.tolist())
        if self.fail_at is not None and len(self.log) == self.fail_at:
            raise OSError(f"request {self.fail_at} failed")
        return self.x[index].clone()

    def close(self) -> None:
        self.closed += 1


def disk_like(dataset: ShiftDataset, log: list, fail_at: int | None = None,
              eval_log: list | None = None) -> ShiftDataset:
    """`dataset` with its train and unlabeled inputs read on demand (one request log for both), and its
    evaluation splits too when `eval_log` is given."""
    def wrapped(name: str, split: Split) -> Split:
        if name in dataset.eval_splits:
            return split if eval_log is None else dataclasses.replace(split, x=DiskLikeInputs(split.x, eval_log))
        return dataclasses.replace(split, x=DiskLikeInputs(split.x, log, fail_at))
    return dataclasses.replace(dataset, splits={name: wrapped(name, split) for name, split in dataset.splits.items()})


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


class Checkpoints(Callback):
    def __init__(self, root: Path) -> None:
        self.root = root

    def on_epoch_end(self, report: EpochReport) -> None:
        report.write_checkpoint(self.root / f"epoch_{report.epoch}")


def config(**values) -> TrainConfig:
    return TrainConfig.from_flat({"epochs": 2, "max_steps_per_epoch": 3, **values})


# ----- the prefetcher itself ---------------------------------------------------------------------------
def test_reads_ahead_in_order_drawing_keys_no_further_than_depth():
    drawn: list[int] = []

    def keys() -> Iterator[int]:
        for k in range(10):
            drawn.append(k)
            yield k

    with Prefetcher(keys(), lambda k: k * k, depth=3) as reads:
        first = next(reads)
        assert first == 0 and drawn == [0, 1, 2, 3]  # batch 0 handed over, batches 1..3 queued
        assert [first, *reads] == [k * k for k in range(10)]
    assert not prefetch_threads()


def test_depth_zero_reads_on_demand_without_a_thread():
    with Prefetcher(iter(range(4)), lambda k: -k, depth=0) as reads:
        assert not prefetch_threads()
        assert list(reads) == [0, -1, -2, -3]


def test_a_failed_read_reaches_the_caller_and_the_thread_is_joined():
    def load(k: int) -> int:
        if k == 2:
            raise OSError("bad file")
        return k

    with pytest.raises(OSError, match="bad file"), Prefetcher(iter(range(100)), load, depth=4) as reads:
        list(reads)
    assert not prefetch_threads()


# ----- the trainer reads the same batches ahead as on demand -----------------------------------------------
@pytest.mark.parametrize("algorithm", ["erm", "fixmatch", "groupdro"])  # labeled; + unlabeled; group-balanced
def test_prefetching_trains_on_exactly_the_batches_read_on_demand(algorithm):
    tiny = make_tiny_dataset()
    runs = {}
    for depth in (0, 3):
        log: list = []
        eval_log: list = []
        trainer = Trainer(config(algorithm=algorithm, prefetch=depth, eval_batch_size=10),
                          dataset=disk_like(tiny, log, eval_log=eval_log))
        result = trainer.fit()
        runs[depth] = (result.history, log, eval_log, trainer.final_state)
        assert not prefetch_threads()
    in_memory = Trainer(config(algorithm=algorithm, eval_batch_size=10), dataset=tiny).fit().history
    (history0, log0, eval0, state0), (history3, log3, eval3, state3) = runs[0], runs[3]
    assert log3 == log0 and len(log0) == 2 * 3 * (2 if algorithm == "fixmatch" else 1)
    assert eval3 == eval0 and len(eval0) == 2 * 4 * 5  # 2 epochs x 4 evaluation splits x 48 rows in chunks of 10
    assert history3 == history0 == in_memory  # so the evaluation outputs came back in order, too
    assert all(torch.equal(state0[k], state3[k]) for k in state0)


def test_a_run_failing_mid_epoch_resumes_to_the_uninterrupted_batches(tmp_path):
    tiny = make_tiny_dataset()
    cfg = config(algorithm="fixmatch", epochs=3, prefetch=2)
    full_log: list = []
    full = Trainer(cfg, dataset=disk_like(tiny, full_log)).fit()
    # fixmatch reads a labeled and an unlabeled batch per step: request 9 is step 1 of epoch 1 (mid-epoch)
    broken = disk_like(tiny, [], fail_at=9)
    with pytest.raises(OSError, match="request 9 failed"):
        Trainer(cfg, [Checkpoints(tmp_path)], dataset=broken).fit()
    assert not prefetch_threads()
    assert {split.x.closed for split in broken.splits.values() if isinstance(split.x, DiskLikeInputs)} == {1}
    resumed_log: list = []
    resumed = Trainer(cfg, dataset=disk_like(tiny, resumed_log)).fit(resume_from=tmp_path / "epoch_0")
    assert resumed.history == full.history
    assert resumed_log == full_log[len(full_log) // 3:]  # epochs 1 and 2 read exactly as the uninterrupted run


def test_prefetch_is_validated():
    with pytest.raises(Exception, match="prefetch"):
        TrainConfig.from_flat({"prefetch": -1}).validate()


# ----- real files: a corrupt image fails with one line naming it; no decode thread outlives the run -----------
@pytest.fixture
def wilds_images(tmp_path, monkeypatch) -> Path:
    iwildcam_fixture.write(tmp_path)
    camelyon17_fixture.write(tmp_path)
    camelyon17_fixture.patched_unlabeled_class(monkeypatch)
    monkeypatch.setenv("RAYBENCH_WILDS_ROOT", str(tmp_path))
    return tmp_path


def wilds_config(name: str, **values) -> TrainConfig:
    return TrainConfig.from_flat({"dataset": name, "algorithm": "erm", "batch_size": 4, "epochs": 1,
                                  "max_steps_per_epoch": 2, "eval_batch_size": 8, "device": "cpu",
                                  "input_size": 32, **values})


def decode_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"raybench-{name}")]


@pytest.mark.parametrize("name, image_dir", [("iwildcam", "iwildcam_v2.0/train"),  # decoded by raybench
                                             ("camelyon17", "camelyon17_v1.0/patches")])  # inside wilds' get_input
def test_a_corrupt_image_fails_the_run_with_one_line_naming_the_file(name, image_dir, wilds_images):
    from raybench.data import load_dataset

    dataset = load_dataset(name)
    files = corrupt_images(wilds_images / image_dir)  # every labeled image: whichever the first batch draws
    with pytest.raises(InputReadError) as err:
        Trainer(wilds_config(name), dataset=dataset).fit()
    message = str(err.value)
    assert "\n" not in message and any(str(path) in message for path in files), message
    assert not prefetch_threads() and not decode_threads(name)


def test_a_wilds_run_leaves_no_decode_threads(wilds_images):
    result = Trainer(wilds_config("iwildcam", prefetch=2)).fit()
    assert result.history
    assert not prefetch_threads() and not decode_threads("iwildcam")


def corrupt_images(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])  # a truncated download
    return files


def test_raybench_train_says_which_file_is_unreadable_in_one_line(wilds_images, tmp_path):
    from helpers.cli import run_cli

    files = corrupt_images(wilds_images / "iwildcam_v2.0" / "train")
    env = {**os.environ, "RAYBENCH_WILDS_ROOT": str(wilds_images)}
    done = run_cli(["train", "--dataset", "iwildcam", "--epochs", "1", "--set", "input_size=32",
                    "--set", "batch_size=4", "--set", "max_steps_per_epoch=1", "--set", "device=cpu"],
                   env, tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("raybench: unreadable input:")]
    assert len(lines) == 1 and any(str(path) in lines[0] for path in files), done.stderr[-2000:]


def test_a_sweep_fails_an_unreadable_input_with_its_reason_instead_of_retrying():
    from raybench.sweep.ray_worker import FAILURE_KEY, deterministic_failure

    report = deterministic_failure(InputReadError("iwildcam example 3: cannot read /data/a.jpg: image file is truncated"))
    assert report is not None
    assert report[FAILURE_KEY] == "unreadable input: iwildcam example 3: cannot read /data/a.jpg: image file is truncated"
    assert deterministic_failure(RuntimeError("a worker died")) is None  # anything else: Train's retries apply
