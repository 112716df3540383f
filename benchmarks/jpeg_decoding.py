"""JPEG decoding for iWildCam at 448 px: the host path (PIL in the thread pool) against batched `decode_jpeg`.

The data is iWildCam in the exact on-disk format the wilds package reads (tests/wilds_fixtures/iwildcam.py),
its labeled images rewritten as camera-sized JPEGs (`--frame`, default 768 x 1024; the release's frames are
1536 x 2048 and 1080 x 1920), smooth gradients plus noise so they compress like photographs. Side by side, the
sides taking turns, `--repeats` times each, the median printed:

    host         `split.x[ids]`: the WildsInputs thread pool opens, decodes (PIL) and resizes each image
    decode cpu   `move_to(split.x[ids], cpu)` after `decoding_on(cpu)`: threads read bytes, decode_jpeg + resize
    decode cuda  the same with cuda (nvJPEG), when a GPU is present: images/s include the host-to-device wait

    .venv/bin/python benchmarks/jpeg_decoding.py                       # 4 batches of 16, frames 768 x 1024
    .venv/bin/python benchmarks/jpeg_decoding.py --frame 1536 2048 --batches 8 --workers 16
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Gradients plus mild noise: compresses to a few hundred KB at quality 90, as camera frames do."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    return np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)


def write_frames(root: Path, frame: tuple[int, int]) -> None:
    from tests.wilds_fixtures import iwildcam

    iwildcam.write(root)
    rng = np.random.default_rng(0)
    for path in sorted((root / iwildcam.LABELED_DIR / "train").glob("*.jpg")):
        Image.fromarray(photo_like(rng, *frame)).save(path, quality=90)


def timed(read: Callable[[], torch.Tensor], images: int) -> float:
    start = time.perf_counter()
    batch = read()
    if batch.is_cuda:
        torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frame", type=int, nargs=2, default=(768, 1024), metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="batches per timed read (of the 20 train images)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="host decode threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        write_frames(Path(tmp), tuple(args.frame))
        os.environ["RAYBENCH_WILDS_ROOT"] = tmp
        from raybench.data import load_dataset
        from raybench.data.base import move_to

        host = load_dataset("iwildcam")
        host.splits["train"].x.workers = args.workers
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        split = host.splits["train"]
        rows = [torch.arange(i, i + args.batch) % len(split) for i in range(args.batches)]
        sides: dict[str, Callable[[], torch.Tensor]] = {"host (PIL, thread pool)": lambda: torch.cat(
            [split.x[r] for r in rows])}
        for device in devices:
            encoded = host.decoding_on(device).splits["train"]
            encoded.x.workers = args.workers
            sides[f"decode_jpeg on {device}"] = lambda x=encoded.x, d=device: torch.cat([move_to(x[r], d) for r in rows])
        for read in sides.values():  # warm-up: thread pools, nvJPEG handle, allocator
            read()
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, read in sides.items():
                rates[name].append(timed(read, args.batch * args.batches))
        print(f"iWildCam train, frames {args.frame[0]}x{args.frame[1]} -> 448x448, batch {args.batch} x "
              f"{args.batches}, {args.workers} host threads, torch threads {torch.get_num_threads()}, "
              f"median of {args.repeats}")
        for name, values in rates.items():
            print(f"  {name:26s} {statistics.median(values):8.1f} images/s   "
                  f"(runs: {', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
