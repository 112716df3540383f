"""The random streams a run draws from: seeding them, forking them, and saving them as plain data.

A resumed run must continue on exactly the streams it left, so their states travel in `state.pt`;
that file is read with `weights_only=True`, so the states are stored as tensors, lists and ints only.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    """One 32-bit seed from several integers (e.g. a run's seed and a round), well mixed, never colliding by sum."""
    return int(np.random.SeedSequence([p % 2**63 for p in parts]).generate_state(1)[0])


def _cuda_devices() -> list[int]:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a nested fit without moving this process's Python, NumPy and torch random streams."""
    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=_cuda_devices()):
        yield
    random.setstate(states[0])
    np.random.set_state(states[1])


@contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Draw from streams seeded by `seed` alone, then return to this process's own streams unmoved.

    Why: work every data-parallel rank must do identically (a teacher labelling the unlabeled split
    through a random view) cannot use the rank's own stream, which is seeded with the rank.
    """
    with preserved_rng():
        seed_everything(seed)
        yield


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch and CUDA stream states as tensors, lists and ints (loadable with weights_only)."""
    version, mt_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": list(mt_state), "gauss": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    python, numpy = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    np.random.set_state((numpy["kind"], np.asarray(numpy["keys"], dtype=np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
