"""Reading ahead: while the loop computes on batch t, one background thread reads batches t+1 .. t+depth.

The caller's iterator of keys (index batches, slices) is drawn on the caller's thread, in order, when a read
is queued. The trainer's seeded generators are therefore consumed in exactly the order and amount of a
loop that reads on demand: prefetching changes when a batch is read, never which batch or its place in the
stream, and an epoch never draws a key past its last step (a resumed run continues exactly).

Why a thread rather than DataLoader worker processes: WILDS inputs already fan each batch out over a decode
pool whose work (PIL, numpy, torch) releases the GIL, so one reader thread keeps that pool busy while the step
computes, with no dataset pickled into worker processes, no batch copied back between processes, no process
to leave behind, and the decode error raised as itself. benchmarks/data_path.py measures it against a plain
DataLoader(num_workers=2) side by side; benchmarks/README.md has the table.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

K = TypeVar("K")
T = TypeVar("T")
THREAD_PREFIX = "raybench-prefetch"


class Prefetcher(Generic[K, T]):
    """`load(key)` for every key of `keys`, in order, at most `depth` reads ahead; depth 0 reads on demand.

    Use it as a context manager: leaving the block (normally or by an exception) cancels the queued reads and
    joins the thread. `wait_s` is the time the caller spent blocked on a read (all of it when depth is 0).
    """

    def __init__(self, keys: Iterable[K], load: Callable[[K], T], depth: int, name: str = THREAD_PREFIX) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._keys: Iterator[K] = iter(keys)
        self._load = load
        self.depth = depth
        self.wait_s = 0.0
        self._pending: deque[Future[T]] = deque()
        self._keys_left = True
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix=name) if depth else None

    def __iter__(self) -> Prefetcher[K, T]:
        return self

    def __next__(self) -> T:
        if self._pool is None:
            key = next(self._keys)
            return self._timed(lambda: self._load(key))
        self._queue_reads()
        if not self._pending:
            raise StopIteration
        value = self._timed(self._pending.popleft().result)
        self._queue_reads()  # the next read starts before the caller computes on this one
        return value

    def _timed(self, read: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return read()
        finally:
            self.wait_s += time.perf_counter() - start

    def _queue_reads(self) -> None:
        assert self._pool is not None
        while self._keys_left and len(self._pending) < self.depth:
            try:
                key = next(self._keys)
            except StopIteration:
                self._keys_left = False
                return
            self._pending.append(self._pool.submit(self._load, key))

    def close(self) -> None:
        """Cancel queued reads and join the thread (a read already running finishes first)."""
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._keys_left = False

    def __enter__(self) -> Prefetcher[K, T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pinned(value: Any) -> Any:
    """A batch component in page-locked memory, so its copy to the GPU can be asynchronous (non_blocking)."""
    if isinstance(value, Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {k: pinned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(pinned(v) for v in value)
    return value


def is_lazy(x: Any) -> bool:
    """Inputs read on demand (files on disk), as opposed to a tensor already in memory."""
    return x is not None and not isinstance(x, torch.Tensor)
