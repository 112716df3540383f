"""wilds 2.0.0 on today's stack: every patch raybench needs, applied at the package boundary, in one place.

wilds 2.0.0 (and the ogb package it loads molpcba through) was written for torch 1.x, pandas 1.x and
PyG 2.0. Rather than pin that old stack, `apply()` patches the few places where it breaks, each scoped to
the wilds or ogb module that needs it, never to torch or pandas as a whole:

- `torch_scatter` (a compiled extension with no wheel for this torch) is imported by wilds'
  `avg_over_groups` in `eval`; a pure-torch stand-in built on `Tensor.scatter_reduce` takes its place;
- pandas 3 reads CivilComments' `split` column as a string dtype, and wilds then writes split ids into it;
  its CSVs are read with that column as plain objects, as pandas 1 did;
- ogb's `torch.load` of its own processed graphs needs `weights_only=False` on torch >= 2.6;
- PyG >= 2.3's `Collater` takes the dataset as its first argument, which wilds does not pass;
- transformers 5 dropped `AdamW`, which WILDS' example code imports; it is torch's `AdamW`;
- ogb downloads a missing dataset, and asks on stdin whether to re-download one without its RELEASE
  file: here both raise `MissingDataError` naming the missing file, and the version check ogb starts in
  a thread (network) is skipped.

`apply()` is idempotent and cheap; every raybench entry point into wilds calls it first.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

_APPLIED = False


class MissingDataError(FileNotFoundError):
    """A dataset file is not on disk; raybench never downloads during a run (see `raybench data prepare`)."""


def apply() -> None:
    """Install every patch once, before wilds or ogb is imported anywhere."""
    global _APPLIED
    # On every call: transformers swaps its lazy module object in sys.modules when some models load, which
    # drops an alias set on the old object.
    alias_transformers_adamw()
    if _APPLIED:
        return
    install_torch_scatter()
    silence_ogb_version_check()
    _patch_ogb()
    _patch_civilcomments()
    _APPLIED = True


# ----- torch_scatter ------------------------------------------------------------------------------
def scatter(src: Tensor, index: Tensor, dim: int = -1, dim_size: int | None = None, reduce: str = "sum") -> Tensor:
    """`torch_scatter.scatter` as wilds calls it (a new tensor, no `out=`): empty slots are 0, as in torch_scatter."""
    dim = dim % src.dim()
    size = list(src.shape)
    size[dim] = int(dim_size if dim_size is not None else (int(index.max()) + 1 if index.numel() else 0))
    if index.dim() < src.dim():  # torch_scatter broadcasts a 1-D index along `dim`
        shape = [1] * src.dim()
        shape[dim] = -1
        index = index.view(shape).expand_as(src)
    result = torch.zeros(size, dtype=src.dtype, device=src.device)
    mode = {"sum": "sum", "add": "sum", "mean": "mean", "max": "amax", "min": "amin", "mul": "prod"}[reduce]
    return result.scatter_reduce(dim, index, src, reduce=mode, include_self=False)


def install_torch_scatter() -> None:
    """Register the stand-in as `torch_scatter` unless the real extension is installed."""
    if "torch_scatter" in sys.modules:
        return
    try:
        import torch_scatter  # noqa: F401  (the real one, where a user has built it)
        return
    except ImportError:
        pass
    module = types.ModuleType("torch_scatter")
    module.scatter = scatter  # type: ignore[attr-defined]
    module.__doc__ = "raybench's pure-torch stand-in for torch_scatter.scatter (see raybench.data.wilds.compat)"
    sys.modules["torch_scatter"] = module


# ----- ogb -------------------------------------------------------------------------------------
def silence_ogb_version_check() -> None:
    """ogb starts a non-daemon thread that asks PyPI for a newer ogb: offline it delays every exit ~10 s."""
    os.environ.setdefault("OUTDATED_IGNORE", "1")
    try:
        import outdated
    except ImportError:
        return
    outdated.check_outdated = lambda package, version, *args, **kwargs: (False, version)  # type: ignore[assignment]


def _refuse_download(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        target = " ".join(str(a) for a in args[:2])
        raise MissingDataError(
            f"{what} is missing ({target}); raybench never downloads during a run: "
            f"fetch it once with `raybench data prepare ogb-molpcba --root DIR` on a machine with internet"
        )
    return refuse


def _refuse_prompt(question: str = "") -> str:
    raise MissingDataError(
        "ogbg_molpcba has files but no RELEASE_v1.txt; ogb would ask whether to delete and re-download it. "
        "Add the release file or re-run `raybench data prepare ogb-molpcba`"
    )


class _TorchLoadingOwnFiles(types.ModuleType):
    """ogb's view of torch: `torch.load` of the graphs ogb itself processed, with weights_only=False."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("weights_only", False)
        return torch.load(*args, **kwargs)


# (module, attribute) -> ogb's original, restored by `downloads_allowed()` for `raybench data prepare`.
_NO_DOWNLOAD_ORIGINALS: dict[tuple[Any, str], Any] = {}


def _refuse(module: Any, attribute: str, replacement: Any) -> None:
    _NO_DOWNLOAD_ORIGINALS[(module, attribute)] = getattr(module, attribute, None)
    setattr(module, attribute, replacement)


def _patch_ogb() -> None:
    try:
        from ogb.graphproppred import dataset_pyg
    except ImportError:
        return
    dataset_pyg.torch = _TorchLoadingOwnFiles("torch")  # type: ignore[attr-defined]
    _refuse(dataset_pyg, "input", _refuse_prompt)  # a module global shadows the builtin
    _refuse(dataset_pyg, "decide_download", _refuse_download("the ogbg_molpcba dataset folder"))
    _refuse(dataset_pyg, "download_url", _refuse_download("the ogbg_molpcba dataset folder"))
    from torch_geometric.loader.dataloader import Collater

    collater = functools.partial(Collater, None)  # PyG >= 2.3 takes the dataset first; wilds passes none
    from wilds.datasets import ogbmolpcba_dataset
    from wilds.datasets.unlabeled import ogbmolpcba_unlabeled_dataset

    for module in (ogbmolpcba_dataset, ogbmolpcba_unlabeled_dataset):
        module.PyGCollater = collater  # type: ignore[attr-defined]
        if hasattr(module, "download_url"):
            _refuse(module, "download_url", _refuse_download("raw/scaffold_group.npy of ogbg_molpcba"))


@contextlib.contextmanager
def downloads_allowed() -> Iterator[None]:
    """ogb's own download functions back for the block (`raybench data prepare`, never a training run)."""
    apply()
    patched = {key: getattr(*key) for key in _NO_DOWNLOAD_ORIGINALS}
    try:
        for (module, attribute), original in _NO_DOWNLOAD_ORIGINALS.items():
            if original is None:
                delattr(module, attribute)
            else:
                setattr(module, attribute, original)
        yield
    finally:
        for (module, attribute), replacement in patched.items():
            setattr(module, attribute, replacement)


# ----- CivilComments ----------------------------------------------------------------------------
class _PandasReadingSplitAsObject(types.ModuleType):
    """pandas as CivilComments sees it: `read_csv` keeps the `split` column as objects (pandas 1 behaviour)."""

    def __getattr__(self, name: str) -> Any:
        import pandas
        return getattr(pandas, name)

    @staticmethod
    def read_csv(*args: Any, **kwargs: Any) -> Any:
        import pandas
        dtype = kwargs.pop("dtype", None) or {}
        if isinstance(dtype, dict):
            dtype = {"split": object, **dtype}
        return pandas.read_csv(*args, dtype=dtype, **kwargs)


def _patch_civilcomments() -> None:
    from wilds.datasets import civilcomments_dataset
    from wilds.datasets.unlabeled import civilcomments_unlabeled_dataset

    for module in (civilcomments_dataset, civilcomments_unlabeled_dataset):
        module.pd = _PandasReadingSplitAsObject("pandas")  # type: ignore[attr-defined]


# ----- transformers -----------------------------------------------------------------------------
def alias_transformers_adamw() -> None:
    """`from transformers import AdamW` (WILDS' examples) resolves to torch's AdamW on transformers 5."""
    try:
        import transformers
    except ImportError:
        return
    if getattr(transformers, "AdamW", None) is not torch.optim.AdamW:
        transformers.AdamW = torch.optim.AdamW  # type: ignore[attr-defined]
