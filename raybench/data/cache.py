"""Self-checking `.npz` caches for generated datasets.

Why: a dataset cache written by an interrupted run, a full disk or an older layout used to be trusted
as is (`np.load` on whatever file sat at the path), so a truncated file crashed deep inside numpy and
a stale one trained silently on wrong-shaped data. Every cached dataset should go through
`load_npz_or_rebuild`, which checks the file against the layout the caller expects and regenerates
it, printing one line to stderr, when it does not match.

API:
  - `load_npz_or_rebuild(path, expected, generate, dtypes=None) -> dict[str, np.ndarray]`
      `path`: the `.npz` cache file (its folder is created when needed).
      `expected`: `{array name: shape}`; a shape is a tuple of ints, with `None` for a free dimension
        (e.g. `{"train.x": (None, 3, 16, 16), "train.y": (None,)}`). The file must hold exactly these
        names: a missing or an extra name, or a shape that differs, means the cache is rebuilt.
      `generate`: a zero-argument callable that builds the arrays from scratch (use
        `functools.partial` or a lambda to bind its parameters).
      `dtypes`: optional `{array name: dtype}`; a listed array with another dtype means a rebuild.
    Returns the arrays (from the file when it is sound, else freshly generated and saved). A file
    that cannot be read as an npz (empty, truncated, bad CRC, pickled objects) or does not match is
    reported as `raybench: rebuilding corrupted cache <path>: <reason>` on stderr and replaced.
    Generated arrays that do not match `expected`/`dtypes` raise ValueError (a bug in the caller).
  - `save_npz_atomically(arrays, path)`: write to a temp file in the same folder, then `os.replace`,
    so a reader never sees a half-written cache.
  - `layout_problem(arrays, expected, dtypes=None) -> str | None`: why `arrays` do not match, or None.

Example (the pattern in `raybench.data.digits_shift.load_or_generate`):

    arrays = load_npz_or_rebuild(path, expected_layout(), lambda: generate(seed),
                                 dtypes={"train.x": np.uint8})
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Union

import numpy as np
from numpy.typing import DTypeLike

Shape = Sequence[int | None]
PathLike = Union[str, "os.PathLike[str]"]

# What np.load and NpzFile raise on an unreadable archive: empty (EOFError), truncated or not a zip
# (BadZipFile, OSError), corrupted members (zlib.error, BadZipFile "Bad CRC-32"), pickled objects (ValueError).
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def save_npz_atomically(arrays: Mapping[str, np.ndarray], path: PathLike) -> None:
    """Write to a temp file beside `path`, then rename: readers never see a half-written cache."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def shape_matches(shape: tuple[int, ...], expected: Shape) -> bool:
    """True when `shape` has the expected rank and every fixed (non-None) dimension."""
    return len(shape) == len(expected) and all(e is None or e == s for s, e in zip(shape, expected))


def layout_problem(arrays: Mapping[str, np.ndarray], expected: Mapping[str, Shape],
                   dtypes: Mapping[str, DTypeLike] | None = None) -> str | None:
    """One phrase saying how `arrays` differ from the expected names, shapes and dtypes, or None."""
    missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing:
        return f"missing array(s) {', '.join(missing)}"
    if extra:
        return f"unexpected array(s) {', '.join(extra)}"
    for name, shape in expected.items():
        if not shape_matches(arrays[name].shape, shape):
            want = "(" + ", ".join("*" if d is None else str(d) for d in shape) + ")"
            return f"{name} has shape {arrays[name].shape}, expected {want}"
    for name, dtype in (dtypes or {}).items():
        if arrays[name].dtype != np.dtype(dtype):
            return f"{name} has dtype {arrays[name].dtype}, expected {np.dtype(dtype)}"
    return None


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the archive, fully read (so a corrupted member fails here, not later)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def cached_or_problem(path: Path, expected: Mapping[str, Shape],
                      dtypes: Mapping[str, DTypeLike] | None) -> tuple[dict[str, np.ndarray] | None, str]:
    """(the cached arrays, "") when the file is sound; (None, why not) otherwise."""
    try:
        arrays = read_npz(path)
    except READ_ERRORS as err:
        detail = str(err).splitlines()[0] if str(err) else ""
        return None, f"unreadable ({type(err).__name__}{': ' + detail if detail else ''})"
    problem = layout_problem(arrays, expected, dtypes)
    return (None, problem) if problem else (arrays, "")


def load_npz_or_rebuild(path: PathLike, expected: Mapping[str, Shape],
                        generate: Callable[[], Mapping[str, np.ndarray]],
                        dtypes: Mapping[str, DTypeLike] | None = None) -> dict[str, np.ndarray]:
    """The cached arrays when `path` holds a sound cache, else freshly generated ones (then saved).

    A corrupted or stale file is reported in one stderr line naming it, then replaced atomically.
    """
    path = Path(path)
    if path.exists():
        arrays, problem = cached_or_problem(path, expected, dtypes)
        if arrays is not None:
            return arrays
        print(f"raybench: rebuilding corrupted cache {path}: {problem}", file=sys.stderr, flush=True)
    fresh = dict(generate())
    problem = layout_problem(fresh, expected, dtypes)
    if problem:
        raise ValueError(f"{path}: generated arrays do not match the expected cache layout: {problem}")
    save_npz_atomically(fresh, path)
    return fresh
