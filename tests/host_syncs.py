"""Counting, on a CPU, the tensor calls that would make the host wait for the GPU.

On CUDA, reading a tensor's value on the host (`bool(t)`, `t.item()`, `float(t)`, `t.tolist()`, `t.cpu()`), or an
operation whose output shape depends on the values (`nonzero`, boolean-mask indexing, `unique`), blocks the CPU
until the GPU has finished everything queued before it: the CPU can then not queue step n+1 while the GPU runs
step n. None of that is visible on a CPU, where every such call is cheap, so the training step's code is run here
under a `TorchFunctionMode` that sees every such call and names where it came from. The count is what the same code
would do on a GPU; the tests hold it at zero per step.
"""
from __future__ import annotations

import collections
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Reading a value on the host.
VALUE_READS = frozenset({"__bool__", "item", "tolist", "cpu", "numpy", "__float__", "__int__", "__index__",
                         "__complex__"})
# An output shape that depends on the values: the host must wait to learn it.
DATA_DEPENDENT = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount",
                            "repeat_interleave", "nonzero_static"})
INDEXING = frozenset({"__getitem__", "__setitem__", "index_put_", "index_put"})

TORCH_DIR = os.path.dirname(torch.__file__)
_SKIPPED_FRAMES = (os.path.join(TORCH_DIR, "overrides.py"), os.path.join(TORCH_DIR, "utils", "_contextlib.py"),
                   __file__)


def _bool_mask_in(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in parts)


def syncing_call(name: str, args: tuple[Any, ...]) -> str | None:
    """The kind of host synchronisation this call would force on CUDA, or None."""
    if name in VALUE_READS or name in DATA_DEPENDENT:
        return name
    if name in INDEXING and len(args) > 1 and _bool_mask_in(args[1]):
        return f"{name} with a boolean mask"
    return None


def call_site() -> str:
    """`file:line` of the code that made the call (torch's own dispatch frames skipped), with the nearest raybench
    frame beside it when the call came from inside a library."""
    frames = [f for f in traceback.extract_stack()[:-2] if not f.filename.startswith(_SKIPPED_FRAMES)]
    inner = frames[-1]
    where = f"{_short(inner.filename)}:{inner.lineno}"
    if "raybench" not in inner.filename:
        ours = next((f for f in reversed(frames) if f"{os.sep}raybench{os.sep}" in f.filename
                     and f"{os.sep}tests{os.sep}" not in f.filename), None)
        if ours is not None:
            where += f" (from {_short(ours.filename)}:{ours.lineno})"
    return where


def _short(path: str) -> str:
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}raybench{os.sep}raybench{os.sep}",
                   f"{os.sep}main{os.sep}"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


class HostSyncCounter(TorchFunctionMode):
    """Counts syncing calls by kind and by call site while active; `exempt(site)` names host-only code (a
    tokenizer working on Python strings and host token ids before they are copied to the device)."""

    def __init__(self, exempt: Callable[[str], bool] = lambda site: False) -> None:
        super().__init__()
        self.exempt = exempt
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.by_site: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kind = syncing_call(getattr(func, "__name__", ""), args)
        if kind is not None:
            site = call_site()
            if not self.exempt(site):
                self.by_kind[kind] += 1
                self.by_site[f"{kind} at {site}"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def worst(self, n: int = 8) -> list[tuple[str, int]]:
        return self.by_site.most_common(n)


@contextmanager
def counting_syncs(exempt: Callable[[str], bool] = lambda site: False) -> Iterator[HostSyncCounter]:
    counter = HostSyncCounter(exempt)
    with counter:
        yield counter


def counted_method(owner: type, name: str, counter: HostSyncCounter) -> Callable[..., Any]:
    """`owner.name` wrapped so that only its own calls are counted (e.g. the trainer's step, not its evaluation)."""
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        with counter:
            return original(*args, **kwargs)

    return counted


def summary(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{n} x {site}" for site, n in counts.items()) or "none"
