"""`raybench data check` and `raybench data prepare`: is a WILDS copy complete, and fetching one.

A missing patch among 450,000 fails a run hours in, on a cluster; `check` lists exactly which files a
copy lacks before any work starts. Each dataset's file layout is one module in `layouts/`. `prepare`
is the only code path in raybench that downloads, through the `wilds` package (and ogb for molpcba).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from raybench.data.wilds import compat

MissingFiles = Callable[[Path, bool], list[str]]


@dataclass(frozen=True)
class CheckReport:
    name: str
    root: Path
    missing_labeled: list[str]
    missing_unlabeled: list[str]

    @property
    def loadable(self) -> bool:
        """The labeled data is complete (unlabeled data is needed only by methods that use it)."""
        return not self.missing_labeled

    def lines(self, limit: int = 20) -> list[str]:
        out = [f"{self.name} under {self.root}:"]
        for part, missing in (("labeled", self.missing_labeled), ("unlabeled", self.missing_unlabeled)):
            if not missing:
                out.append(f"  {part}: complete")
                continue
            out.append(f"  {part}: {len(missing)} missing file{'s' if len(missing) != 1 else ''}")
            out.extend(f"    {path}" for path in missing[:limit])
            if len(missing) > limit:
                out.append(f"    ... and {len(missing) - limit} more")
        return out


def layout(name: str) -> MissingFiles:
    """The `missing_files` function of a dataset's layout module (layouts/<name with _ for ->.py)."""
    module = importlib.import_module(f"raybench.data.wilds.layouts.{name.replace('-', '_')}")
    return module.missing_files  # type: ignore[no-any-return]


def check(name: str, root: Path) -> CheckReport:
    missing = layout(name)
    return CheckReport(name, Path(root), missing(Path(root), False), missing(Path(root), True))


def prepare(name: str, root: Path, unlabeled: bool = True) -> None:
    """Download the labeled (and unlabeled) data through the wilds package; needs internet."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with compat.downloads_allowed():
        import wilds

        wilds.get_dataset(name, root_dir=str(root), download=True)
        if unlabeled:
            wilds.get_dataset(name, unlabeled=True, root_dir=str(root), download=True)
