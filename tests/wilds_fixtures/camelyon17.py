"""A tiny Camelyon17-WILDS (labeled v1.0 + unlabeled v1.0) in the exact on-disk format wilds 2.0.0 reads.

Layout written under `root` (the `root_dir` given to `wilds.get_dataset`):

    camelyon17_v1.0/RELEASE_v1.0.txt
    camelyon17_v1.0/metadata.csv            unnamed index column (read with index_col=0), then
                                            patient (zero-padded str "004"), node, x_coord, y_coord,
                                            tumor (0/1), slide, center, split (0 train / 1 id_val)
    camelyon17_v1.0/patches/patient_{p}_node_{n}/patch_patient_{p}_node_{n}_x_{x}_y_{y}.png   96x96 RGB
    camelyon17_unlabeled_v1.0/...           the same, tumor -1 (the class derives the split from center)

The loader, not the file, turns centers 1 and 2 into the OOD `val` and `test` splits (and the
unlabeled `val_unlabeled` / `test_unlabeled`); centers 0, 3, 4 are `train`/`id_val` and
`train_unlabeled`. Slides follow the real numbering (center c holds slides 10c..10c+9 and patients
20c..20c+19, so slide 23 is a center-2 slide, as the `mixed-to-test` scheme assumes). Unlabeled slides
get ids from 50 up, apart from the labeled ones (a fixture choice: the loader only reads them as ints).

`Camelyon17UnlabeledDataset.__init__` asserts the full release's row counts (600,030 / 600,030 /
1,799,247), which no small copy can meet; `patched_unlabeled_class` swaps in the real class with only
those asserts compiled out (see `unlabeled_class`).
"""
from __future__ import annotations

import ast
import functools
import inspect
import pathlib
import textwrap
import types
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

LABELED_DIR = "camelyon17_v1.0"
UNLABELED_DIR = "camelyon17_unlabeled_v1.0"
RELEASE = "RELEASE_v1.0.txt"
PATCH_SIDE = 96  # the loader reports (96, 96) as the original resolution; models are built for it
CENTERS = (0, 1, 2, 3, 4)  # 1 = OOD val, 2 = OOD test, the rest train/id_val
SLIDES_PER_CENTER = 2
LABELED_PATCHES_PER_SLIDE = 6  # 4 train + 2 id_val on train centers
UNLABELED_PATCHES_PER_SLIDE = 4
FIRST_UNLABELED_SLIDE = 50
SEED = 17
N_UNLABELED_ASSERTS = 3  # the three full-size row-count asserts the fixture class compiles out


def write(root: pathlib.Path) -> None:
    """Write the labeled and unlabeled copies under `root`, deterministically."""
    rng = np.random.default_rng(SEED)
    _write_copy(root / LABELED_DIR, labeled_rows(rng), rng)
    _write_copy(root / UNLABELED_DIR, unlabeled_rows(rng), rng)


def labeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Both tumor labels in every slide; on train centers two patches per slide go to id_val (split 1)."""
    rows = []
    for center in CENTERS:
        for j in range(SLIDES_PER_CENTER):
            patient, node, slide = 20 * center + 2 * j, int(rng.integers(0, 5)), 10 * center + j
            for k, (x, y) in enumerate(_coords(rng, LABELED_PATCHES_PER_SLIDE)):
                split = 1 if center in (0, 3, 4) and k >= 4 else 0
                rows.append((f"{patient:03d}", node, x, y, k % 2, slide, center, split))
    return _frame(rows)


def unlabeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Patches from other slides of every center, tumor -1 as in the release."""
    rows = []
    for center in CENTERS:
        for j in range(SLIDES_PER_CENTER):
            patient, node = 20 * center + 10 + j, int(rng.integers(0, 5))
            slide = FIRST_UNLABELED_SLIDE + SLIDES_PER_CENTER * center + j
            for x, y in _coords(rng, UNLABELED_PATCHES_PER_SLIDE):
                rows.append((f"{patient:03d}", node, x, y, -1, slide, center, 0))
    return _frame(rows)


def _frame(rows: list[tuple]) -> pd.DataFrame:
    columns = ["patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"]
    return pd.DataFrame(rows, columns=columns)


def _coords(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """Distinct patch corners on a 32-pixel lattice, so no two rows of a slide share a file."""
    cells = rng.choice(400 * 400, size=n, replace=False)
    return [(int(c // 400) * 32, int(c % 400) * 32) for c in cells]


def patch_path(patient: str, node: int, x: int, y: int) -> str:
    """The patch file of one row, relative to the dataset folder (the loader's f-string)."""
    return f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png"


def _write_copy(folder: pathlib.Path, rows: pd.DataFrame, rng: np.random.Generator) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RELEASE).write_text("fixture\n")
    rows.to_csv(folder / "metadata.csv")  # keeps the unnamed index column the loader skips
    for patient, node, x, y in rows[["patient", "node", "x_coord", "y_coord"]].itertuples(index=False):
        path = folder / patch_path(patient, node, x, y)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_blocky_rgb(rng, PATCH_SIDE, PATCH_SIDE)).save(path, compress_level=1)


def _blocky_rgb(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Random 8x8-pixel blocks: varied content that still compresses, so writing stays fast."""
    blocks = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)


# ----- the unlabeled class without its full-size asserts ------------------------------------------
@functools.cache
def unlabeled_class() -> type:
    """`Camelyon17UnlabeledDataset` whose `__init__` is the real one compiled as `python -O` would.

    Why: its `__init__` asserts the row counts of the full release, so a fixture of a few dozen rows
    cannot load through it. Rather than copy its ~40 lines (and drift from them), the real source is
    recompiled with optimize=1, which drops `assert` statements and nothing else; the function keeps
    the real class's `__class__` cell, so its `super().__init__` resolves exactly as before. It refuses
    to build if the count of asserts it would drop is not the expected three (wilds changed).
    """
    from raybench.data.wilds import compat

    compat.apply()
    from wilds.datasets.unlabeled import camelyon17_unlabeled_dataset as module

    real = module.Camelyon17UnlabeledDataset
    init = _compiled_without_asserts(real.__init__, vars(module))
    doc = "Camelyon17UnlabeledDataset minus its full-size row-count asserts (tests only)."
    return type("Camelyon17UnlabeledFixtureDataset", (real,), {"__init__": init, "__doc__": doc})


def _compiled_without_asserts(function: types.FunctionType, module_globals: dict[str, Any]) -> types.FunctionType:
    lines, first_line = inspect.getsourcelines(function)
    source = "class _Holder:\n" + textwrap.indent(textwrap.dedent("".join(lines)), "    ")
    tree = ast.parse(source)
    n_asserts = sum(isinstance(node, ast.Assert) for node in ast.walk(tree))
    if n_asserts != N_UNLABELED_ASSERTS:
        raise RuntimeError(f"expected {N_UNLABELED_ASSERTS} asserts in {function.__qualname__}, found {n_asserts}")
    ast.increment_lineno(tree, first_line - 2)  # tracebacks point at the real file's lines
    namespace: dict[str, Any] = {}
    exec(compile(tree, function.__code__.co_filename, "exec", optimize=1), module_globals, namespace)  # noqa: S102  the fixture's own parsed source
    code = namespace["_Holder"].__dict__[function.__name__].__code__
    assert code.co_freevars == function.__code__.co_freevars, "zero-arg super() needs the same cells"
    return types.FunctionType(code, module_globals, function.__name__, function.__defaults__, function.__closure__)


def patched_unlabeled_class(monkeypatch: Any) -> type:
    """Make `wilds.get_dataset("camelyon17", unlabeled=True, ...)` build `unlabeled_class()`.

    `get_dataset` imports the class from its module at call time, so replacing the module attribute
    is enough; `monkeypatch` (pytest's fixture or a `pytest.MonkeyPatch.context()`) undoes it.
    """
    fixture_class = unlabeled_class()
    from wilds.datasets.unlabeled import camelyon17_unlabeled_dataset as module

    monkeypatch.setattr(module, "Camelyon17UnlabeledDataset", fixture_class)
    return fixture_class
