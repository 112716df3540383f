"""`raybench data check` and `raybench data prepare`: is a WILDS copy complete, and fetching one.

A missing patch among 450,000 fails a run hours in, on a cluster; `check` lists exactly which files a
copy lacks before any work starts. Each dataset's file layout is one module in `layouts/`. `prepare`
is the only code path in raybench that downloads, through the `wilds` package (and ogb for molpcba).
"""
from __future__ import annotations

import contextlib
import importlib
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raybench.data.wilds import compat

MissingFiles = Callable[[Path, bool], list[str]]


class DownloadError(RuntimeError):
    """`prepare` could not fetch an archive; the message is the root cause (the URL and the network's reason).

    Why: wilds catches its own download error, prints it amid progress bars and goes on, so the error
    that surfaced was a missing metadata.csv, which blames the wrong thing.
    """


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
    """Download the labeled (and unlabeled) data through the wilds package; needs internet.

    Raises DownloadError naming the URL and the reason when a download fails (no network, HTTP 404).
    """
    Path(root).mkdir(parents=True, exist_ok=True)
    with compat.downloads_allowed(), recorded_download_failures() as failures:
        import wilds

        for kwargs in [{}, {"unlabeled": True}] if unlabeled else [{}]:
            try:
                wilds.get_dataset(name, root_dir=str(root), download=True, **kwargs)
            except Exception as err:
                raise_root_cause(failures, err)
                raise
            raise_root_cause(failures, None)


def network_reason(err: BaseException) -> str:
    """The useful part of a download error: "HTTP Error 404: Not Found", "[Errno -3] Temporary failure ..."."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err_reason: Any = err.reason
        return str(err_reason) or type(err_reason).__name__
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def url_error_in_chain(err: BaseException) -> urllib.error.URLError | None:
    """The first urllib error among `err`, its cause and its context (ogb lets urlopen's errors through)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, urllib.error.URLError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def raise_root_cause(failures: list[tuple[str, BaseException]], err: BaseException | None) -> None:
    """Raise DownloadError for the first recorded failed download, or for a urllib error behind `err`."""
    if failures:
        url, cause = failures[0]
        raise DownloadError(f"cannot download {url}: {network_reason(cause)}") from cause
    url_error = url_error_in_chain(err) if err is not None else None
    if url_error is not None:
        url = getattr(url_error, "url", None) or getattr(url_error, "filename", None)
        where = f" {url}" if url else ""
        raise DownloadError(f"cannot download{where}: {network_reason(url_error)}") from err


def close_progress_bars() -> None:
    """wilds never closes its download bars; left open, they print at exit, after (and over) the error line."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


@contextlib.contextmanager
def recorded_download_failures() -> Iterator[list[tuple[str, BaseException]]]:
    """Record (url, error) of every failed wilds archive download in the block.

    wilds' `download_dataset` catches any exception from `download_and_extract_archive`, prints it and
    carries on, so the error is lost by the time the dataset's constructor fails on a missing file.
    """
    from wilds.datasets import download_utils

    original = download_utils.download_and_extract_archive
    failures: list[tuple[str, BaseException]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as err:
            failures.append((str(kwargs.get("url", args[0] if args else "(unknown url)")), err))
            close_progress_bars()
            raise

    download_utils.download_and_extract_archive = recording
    try:
        yield failures
    finally:
        download_utils.download_and_extract_archive = original
