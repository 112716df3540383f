"""Texts that depend only on raybench's own code, computed once per version of that code and kept on disk.

`raybench list settings`, `list datasets` and `space new` print what the code declares: every algorithm's
hyperparameter dataclass, every dataset's registration. Those declarations live in modules that import torch
(an algorithm's `Hparams` sits beside its torch code, as one file per algorithm requires; SpuCo's variants and
the WILDS datasets register in loops), so computing such a text costs seconds of imports for a few lines that
change only when the code does. The first run computes the text and files it under the code's version: a hash
of every file of the installed raybench package (its Python sources and the data files they read, such as the
WILDS datasets' table), so editing or adding a module (a new algorithm) changes the version and the next run
computes afresh. A memo that cannot be read (damaged, another version's format) is recomputed; one that cannot be
written (a read-only home) only costs the next run the imports again.

Where: `$RAYBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/raybench`, else `~/.cache/raybench`; one JSON file per
code version, `code-memo-<version>.json`, written atomically. Only the KEPT most recently written versions stay,
so a developer whose every edit is a new version does not fill the folder, and one who switches between a few
checkouts keeps each one's memo.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

from raybench.paths import write_text_atomically

PACKAGE = Path(__file__).resolve().parent
FORMAT = 1  # bump when the file's layout changes: an older file is then another version's, never misread
KEPT = 8  # memo files kept, the most recently written


@cache
def code_version() -> str:
    """A hash of every file of this raybench package (path and bytes; compiled bytecode left out, since it
    follows the sources), and of the memo's format."""
    digest = hashlib.sha256(f"format {FORMAT}\n".encode())
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def memo_dir() -> Path:
    """Where memo files live: $RAYBENCH_CACHE_DIR, else the XDG cache folder's raybench/."""
    if os.environ.get("RAYBENCH_CACHE_DIR"):
        return Path(os.environ["RAYBENCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raybench"


def memo_file() -> Path:
    return memo_dir() / f"code-memo-{code_version()}.json"


def code_text(key: str, compute: Callable[[], str]) -> str:
    """The text `compute` returns, which must depend on raybench's code alone: from this code version's memo
    when it holds `key`, else computed now and added to the memo."""
    texts = _read_memo()
    if isinstance(texts.get(key), str):
        return texts[key]
    text = compute()
    texts[key] = text
    try:
        memo_dir().mkdir(parents=True, exist_ok=True)
        write_text_atomically(memo_file(), json.dumps(texts, indent=1, sort_keys=True))
        _forget_old_versions()
    except OSError:
        pass  # a memo is an optimisation: the command's answer is the same without one
    return text


def _forget_old_versions() -> None:
    """Remove all but the KEPT most recently written memo files (this version's is the newest)."""
    memos = sorted(memo_dir().glob("code-memo-*.json"), key=lambda path: path.stat().st_mtime, reverse=True)
    for old in memos[KEPT:]:
        old.unlink(missing_ok=True)


def _read_memo() -> dict[str, object]:
    """This code version's memo; empty when there is none, or one that cannot be read as such."""
    try:
        texts = json.loads(memo_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return texts if isinstance(texts, dict) else {}
